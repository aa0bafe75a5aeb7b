"""The output contract, loaded from package data so every module validates against the same file."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

SCHEMA: dict = json.loads(resources.files("specops.task").joinpath("commerce_search.schema.json").read_text("utf-8"))
FIELDS: tuple[str, ...] = tuple(SCHEMA["required"])


@functools.cache
def _validator():
    """Built on first use: the prompt format and the synthetic data need the fields, not the validator."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(SCHEMA)


def validate(obj: Any) -> list[str]:
    """Human-readable schema errors for ``obj`` (empty when valid), each prefixed with the offending path."""
    errors = sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def is_valid(obj: Any) -> bool:
    return _validator().is_valid(obj)
