"""Request bodies of the OpenAI API subset served, with the checks that turn bad input into a 400.

Fields follow OpenAI's names and defaults, plus vLLM's sampling extensions (``top_k``, ``stop_token_ids``,
``ignore_eos``) so one request body means the same thing on either server. Unknown fields are ignored, as both
OpenAI's clients and vLLM send or tolerate extras; features that would change the answer and are not
implemented (log-probabilities, tools, echo, suffix, logit biases, penalties, ``min_p``, ``best_of``) are refused
rather than silently dropped: their neutral values (an empty bias, a zero penalty) are accepted.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N = 16


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _schema_present(self):
        if self.type == "json_schema" and not (
            isinstance(self.json_schema, dict) and isinstance(self.json_schema.get("schema"), dict)
        ):
            raise ValueError("response_format of type 'json_schema' needs json_schema.schema (an object)")
        return self


class SamplingFields(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    response_format: Optional[ResponseFormat] = None
    provenance: bool = False  # extension: each choice carries where its tokens came from (drafts, acceptance)
    logprobs: Optional[Any] = None
    tools: Optional[list[Any]] = None
    logit_bias: Optional[dict[str, Any]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    best_of: Optional[int] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop must be up to 4 non-empty strings")
        return stops

    @model_validator(mode="after")
    def _unsupported(self):
        if self.logprobs not in (None, False):
            raise ValueError("logprobs are not supported by this server")
        if self.tools:
            raise ValueError("tools are not supported by this server")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0),
                              ("min_p", 0.0)):
            if getattr(self, name) != neutral:
                raise ValueError(f"{name} is not supported by this server (only its neutral value {neutral:g})")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported by this server (only best_of = n)")
        return self

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def grammar_format(self) -> Optional[dict[str, Any]]:
        """The response_format as the grammar compiler takes it, or None for free text."""
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        return rf.model_dump(exclude_none=True)


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = Field(16, ge=1)
    echo: bool = False
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and isinstance(v[0], list) and any(not p for p in v):
            raise ValueError("token prompts must not be empty")
        return v

    @model_validator(mode="after")
    def _completion_unsupported(self):
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported by this server")
        return self

    def prompts(self) -> list[Union[str, list[int]]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [list(p)]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str = Field(min_length=1)
    content: Union[str, list[dict[str, Any]]]

    @field_validator("content")
    @classmethod
    def _text_only(cls, v):
        if isinstance(v, list) and not all(p.get("type") == "text" and isinstance(p.get("text"), str) for p in v):
            raise ValueError("only text content parts are supported")
        return v

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p["text"] for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)

    @property
    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


class GammaScheduleRequest(BaseModel):
    """``POST /admin/gamma-schedule``: the γ table the engine drafts by from now on (``--gamma-schedule``'s form)."""

    model_config = ConfigDict(extra="forbid")
    gamma_schedule: list[list[int]]
