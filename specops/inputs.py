"""Request inputs: the one record format every command reads, and how each becomes prompt token ids.

A record carries exactly one of three inputs: a shopper ``query`` (wrapped in the task's system prompt and
rendered by the chat template), raw ``prompt`` text, or chat ``messages``. Rendering follows what transformers'
``apply_chat_template`` and vLLM's OpenAI server both do (render text with the template, then tokenize it
without adding special tokens again), so the same request gives the same prompt tokens everywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specops.errors import SpecopsError
from specops.files import read_jsonl
from specops.task.prompt import messages as task_messages

KINDS = ("query", "prompt", "messages")


@dataclass(frozen=True)
class Input:
    """A checked input: ``kind`` is query or prompt (``value`` a non-empty string) or messages (a list of
    ``{role, content}`` string pairs)."""

    kind: str
    value: Any

    @property
    def messages(self) -> list[dict[str, str]] | None:
        """Chat messages to send (a query in the task's prompt format), or None for raw prompt text."""
        if self.kind == "query":
            return task_messages(self.value)
        if self.kind == "messages":
            return [{"role": m["role"], "content": m["content"]} for m in self.value]
        return None


def parse_input(record: Any) -> Input:
    """The input of one record, or a SpecopsError saying what is wrong with it."""
    if not isinstance(record, dict):
        raise SpecopsError("a request must be a JSON object")
    kinds = [k for k in KINDS if k in record]
    if len(kinds) != 1:
        raise SpecopsError("needs exactly one of 'query', 'prompt' or 'messages'")
    kind, value = kinds[0], record[kinds[0]]
    if kind == "messages":
        if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        ):
            raise SpecopsError("'messages' must be a non-empty list of {role, content} objects with string values")
    elif not isinstance(value, str) or not value.strip():
        raise SpecopsError(f"'{kind}' must be a non-empty string")
    return Input(kind, value)


def read_records(path: str | Path, on_bad: Literal["raise", "skip"] = "raise") -> tuple[list[dict], int]:
    """Request records of a JSONL file, each with an ``id`` (its line number when it has none), and the number of
    lines skipped. A line that is not an object with one usable input raises, naming the line, or is skipped."""
    rows, skipped = read_jsonl(path, on_bad)
    records = []
    for lineno, rec in rows:
        try:
            parse_input(rec)
        except SpecopsError as e:
            if on_bad == "raise":
                raise SpecopsError(f"{path}:{lineno}: {e}") from None
            skipped += 1
            continue
        records.append({"id": str(lineno), **rec} if "id" not in rec else rec)
    if not records:
        raise SpecopsError(f"{path}: no usable requests ({skipped} lines skipped; each line needs exactly one of "
                           "'query', 'prompt' or 'messages')")
    return records, skipped


def chat_prompt_ids(tokenizer, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of ``messages`` followed by the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecopsError("the tokenizer has no chat template; send raw 'prompt' text instead")
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def text_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of raw completion text (special tokens such as BOS added as the tokenizer is configured)."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def query_prompt_ids(tokenizer, query: str) -> list[int]:
    """Token ids of one shopper query in the task's prompt format."""
    return chat_prompt_ids(tokenizer, task_messages(query))


def prompt_ids(tokenizer, inp: Input) -> list[int]:
    messages = inp.messages
    return chat_prompt_ids(tokenizer, messages) if messages is not None else text_prompt_ids(tokenizer, inp.value)


def record_prompt_ids(tokenizer, record: dict[str, Any]) -> list[int]:
    """Prompt ids for one input record carrying exactly one of ``query``, ``prompt`` or ``messages``."""
    return prompt_ids(tokenizer, parse_input(record))


def schema_format(path: Path) -> dict[str, Any]:
    """The response_format for a JSON schema file (``--json-schema``)."""
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecopsError(f"--json-schema: file not found: {path}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecopsError(f"--json-schema: {path} is not JSON: {e}") from None
    if not isinstance(schema, dict):
        raise SpecopsError(f"--json-schema: {path} must hold a JSON object (a schema)")
    return {"type": "json_schema", "json_schema": {"name": Path(path).stem, "schema": schema}}
