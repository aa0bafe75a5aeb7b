"""The task prompt and the one canonical answer serialisation (training targets and gold both use it)."""

from __future__ import annotations

import json
from typing import Any

from specops.task.schema import FIELDS

SYSTEM_PROMPT = (
    "Convert the shopping query into search parameters. Reply with one JSON object on one line and nothing else. "
    "Include every key in this order: " + ", ".join(FIELDS) + ". "
    "Use null, or [] for lists, when the query does not say. Copy keywords, brands and sizes from the query; "
    "prices are numbers in the query's currency."
)


def messages(query: str) -> list[dict]:
    """Chat messages for one shopper query."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": query}]


def _number(value: Any) -> Any:
    """Integral floats become ints (80.0 -> 80) so one value has one spelling; bools are left alone."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def format_answer(params: dict) -> str:
    """Serialise ``params`` as the canonical single-line answer: keys in contract order, UTF-8 text kept."""
    return json.dumps({k: _number(params[k]) for k in FIELDS}, ensure_ascii=False)
