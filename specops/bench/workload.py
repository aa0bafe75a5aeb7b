"""What a benchmark sends: synthetic shopper queries or a JSONL file of requests, in a seeded order, as bodies.

A ``query`` becomes the task's chat messages and a ``messages`` list is sent as is (both to
/v1/chat/completions); raw ``prompt`` text goes to /v1/completions. Records follow ``specops generate``'s
input format.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specops.errors import SpecopsError
from specops.inputs import Input, parse_input, read_records


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: Optional[list[dict[str, str]]] = None
    text: Optional[str] = None

    @property
    def endpoint(self) -> str:
        return "chat/completions" if self.messages is not None else "completions"

    @classmethod
    def of(cls, pid: str, inp: Input) -> "Prompt":
        messages = inp.messages
        return cls(pid, messages=messages) if messages is not None else cls(pid, text=inp.value)

    def body(self) -> dict[str, Any]:
        return {"messages": self.messages} if self.messages is not None else {"prompt": self.text}


def from_dataset(path: Path) -> list[Prompt]:
    """Usable prompts of a JSONL file of request records (``specops generate``'s input); bad lines are skipped."""
    records, _ = read_records(path, on_bad="skip")
    return [Prompt.of(str(rec["id"]), parse_input(rec)) for rec in records]


def synthetic(n: int, seed: int) -> list[Prompt]:
    """``n`` synthetic shopper queries (en + zh-TW) in the task's prompt format."""
    from specops.task.synth import generate

    if n < 1:
        raise SpecopsError("--synthetic must be at least 1")
    return [Prompt.of(str(ex.id), Input("query", ex.query)) for ex in generate(n, seed)]


def dataset_digest(path: Path) -> str:
    """Content hash, so a resumed run can tell that the prompts changed."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ordered(prompts: list[Prompt], n: int, seed: int) -> list[Prompt]:
    """``n`` prompts in a seeded order, cycling through the pool (reshuffled each pass) when it is smaller."""
    rng = random.Random(seed)
    out: list[Prompt] = []
    while len(out) < n:
        batch = list(prompts)
        rng.shuffle(batch)
        out.extend(batch[: n - len(out)])
    return out
