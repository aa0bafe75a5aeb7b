"""Request inputs to prompt token ids, one way for every engine.

Three input kinds exist: a shopper ``query`` (wrapped in the task's system prompt and rendered by the chat
template), raw ``prompt`` text, and chat ``messages``. Rendering follows what transformers'
``apply_chat_template`` and vLLM's OpenAI server both do (render text with the template, then tokenize it
without adding special tokens again), so the same request gives the same prompt tokens everywhere.
"""

from __future__ import annotations

from typing import Any

from specops.errors import SpecopsError
from specops.task.prompt import messages as task_messages


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


def record_prompt_ids(tokenizer, record: dict[str, Any]) -> list[int]:
    """Prompt ids for one input record carrying exactly one of ``query``, ``prompt`` or ``messages``."""
    kinds = [k for k in ("query", "prompt", "messages") if k in record]
    if len(kinds) != 1:
        raise SpecopsError("needs exactly one of 'query', 'prompt' or 'messages'")
    kind, value = kinds[0], record[kinds[0]]
    if kind == "messages":
        if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        ):
            raise SpecopsError("'messages' must be a non-empty list of {role, content} objects with string values")
        return chat_prompt_ids(tokenizer, value)
    if not isinstance(value, str) or not value.strip():
        raise SpecopsError(f"'{kind}' must be a non-empty string")
    return query_prompt_ids(tokenizer, value) if kind == "query" else text_prompt_ids(tokenizer, value)
