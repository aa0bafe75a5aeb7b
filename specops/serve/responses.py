"""Response bodies in OpenAI's shapes: whole completions and SSE chunks, for both endpoints."""

from __future__ import annotations

import json
from typing import Any, Optional

from specops.serve.generation import Generation


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def envelope(gen: Generation, chunked: bool) -> dict:
    if gen.endpoint == "chat":
        return {"id": "chatcmpl-" + gen.id, "object": "chat.completion.chunk" if chunked else "chat.completion",
                "created": gen.created, "model": gen.state.model_name}
    return {"id": "cmpl-" + gen.id, "object": "text_completion", "created": gen.created,
            "model": gen.state.model_name}


def chunk(gen: Generation, index: int, text: Optional[str], finish_reason: Optional[str], first: bool = False) -> dict:
    """One choice's streamed piece; for chat the ``first`` chunk announces the assistant role. A choice's last
    chunk carries its provenance when the request asked for it."""
    if gen.endpoint == "chat":
        delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None and gen.req.provenance:
        choice["provenance"] = gen.choices[index].provenance
    return {**envelope(gen, chunked=True), "choices": [choice]}


def usage_chunk(gen: Generation) -> dict:
    return {**envelope(gen, chunked=True), "choices": [], "usage": gen.usage()}


def full(gen: Generation, texts: dict[int, str]) -> dict:
    if gen.endpoint == "chat":
        choices = [{"index": c.index, "message": {"role": "assistant", "content": texts[c.index]},
                    "logprobs": None, "finish_reason": c.finish_reason} for c in gen.choices]
    else:
        choices = [{"index": c.index, "text": texts[c.index], "logprobs": None, "finish_reason": c.finish_reason}
                   for c in gen.choices]
    if gen.req.provenance:
        for c, out in zip(gen.choices, choices):
            out["provenance"] = c.provenance
    return {**envelope(gen, chunked=False), "choices": choices, "usage": gen.usage()}
