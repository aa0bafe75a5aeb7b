"""Benchmark prompts: synthetic shopper queries or a JSONL file, in a seeded order, as request bodies.

A ``query`` becomes the task's chat messages and a ``messages`` list is sent as is (both to
/v1/chat/completions); raw ``prompt`` text goes to /v1/completions. Records follow ``specops generate``'s
input format.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specops.errors import SpecopsError


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: Optional[list[dict[str, str]]] = None
    text: Optional[str] = None

    @property
    def endpoint(self) -> str:
        return "chat/completions" if self.messages is not None else "completions"

    def body(self) -> dict[str, Any]:
        return {"messages": self.messages} if self.messages is not None else {"prompt": self.text}


def _from_record(rec: Any, fallback_id: str) -> Prompt | None:
    """The prompt of one record, or None when it carries no usable input."""
    from specops.task.prompt import messages as task_messages

    if not isinstance(rec, dict):
        return None
    pid = str(rec.get("id", fallback_id))
    kinds = [k for k in ("query", "prompt", "messages") if k in rec]
    if len(kinds) != 1:
        return None
    value = rec[kinds[0]]
    if kinds[0] == "messages":
        ok = isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)
        return Prompt(pid, messages=[{"role": m["role"], "content": m["content"]} for m in value]) if ok else None
    if not isinstance(value, str) or not value.strip():
        return None
    return Prompt(pid, messages=task_messages(value)) if kinds[0] == "query" else Prompt(pid, text=value)


def from_dataset(path: Path) -> list[Prompt]:
    """Usable prompts of a JSONL file; a file without any is an error saying how many lines were skipped."""
    if not path.is_file():
        raise SpecopsError(f"dataset not found: {path}")
    prompts, skipped = [], 0
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                p = _from_record(json.loads(line), str(lineno))
            except json.JSONDecodeError:
                p = None
            if p is None:
                skipped += 1
            else:
                prompts.append(p)
    if not prompts:
        raise SpecopsError(f"{path}: no usable prompts ({skipped} lines skipped; each line needs exactly one of "
                           "'query', 'prompt' or 'messages')")
    return prompts


def synthetic(n: int, seed: int) -> list[Prompt]:
    """``n`` synthetic shopper queries (en + zh-TW) in the task's prompt format."""
    from specops.task.prompt import messages as task_messages
    from specops.task.synth import generate

    if n < 1:
        raise SpecopsError("--synthetic must be at least 1")
    return [Prompt(str(ex.id), messages=task_messages(ex.query)) for ex in generate(n, seed)]


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
