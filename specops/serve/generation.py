"""One HTTP request's generation: prompt ids and checks, one engine request per choice, text out as it settles.

Both endpoints share this; they differ only in how prompts are rendered and how chunks are shaped. Leaving the
``choices`` iterator early (a client that disconnected, a stop string) aborts the engine requests still
running, so their cache slots are freed at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from specops.engine.grammar import GrammarError
from specops.errors import SpecopsError
from specops.serve.detok import Detokenizer
from specops.serve.errors import APIError
from specops.serve.protocol import SamplingFields
from specops.serve.runner import Event, Grammar


@dataclass
class Choice:
    index: int
    prompt_index: int
    request_id: str
    detok: Detokenizer
    finish_reason: Optional[str] = None
    done: bool = False
    provenance: Optional[dict] = None  # when the request asked for it and the engine finished the choice

    @property
    def num_tokens(self) -> int:
        return len(self.detok.token_ids)


@dataclass
class Delta:
    choice: Choice
    text: str
    finish_reason: Optional[str]  # set on the choice's last delta


def check_room(state, needed: int) -> None:
    """429 with Retry-After when ``needed`` more engine requests would overfill the queue. Handlers call it first,
    before any tokenizing, so a burst's excess is turned away cheaply; ``Generation.start`` calls it again right
    before queuing, where it is exact. A request that could never fit is ``start``'s 400, not a 429."""
    if needed <= state.max_queue and state.runner.outstanding + needed > state.max_queue:
        raise APIError(429, f"server queue is full ({state.max_queue} requests); retry later",
                       code="queue_full", headers={"Retry-After": "1"})


@dataclass
class Generation:
    """The engine requests behind one HTTP request."""

    state: Any  # specops.serve.app.ServerState
    prompts: list[list[int]]
    req: SamplingFields
    max_tokens: list[int]
    endpoint: str  # metrics label
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    choices: list[Choice] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    _queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    _first_seen: bool = False

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.choices)

    def usage(self) -> dict[str, int]:
        p, c = self.prompt_tokens, self.completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _params(self, i: int, max_tokens: int):
        from specops.engine.sampling import SamplingParams

        r = self.req
        return SamplingParams(
            temperature=r.temperature, top_p=r.top_p, top_k=max(r.top_k, 0), max_tokens=max_tokens,
            stop=r.stops, stop_token_ids=list(r.stop_token_ids), ignore_eos=r.ignore_eos,
            seed=None if r.seed is None else r.seed + i,
        )

    async def _grammar(self) -> Grammar:
        """What each choice's grammar constraint is built from (the format compiled once here, off the event loop,
        so a bad schema is this request's 400 before anything is queued), or None for free text."""
        fmt = self.req.grammar_format
        if fmt is None:
            return None
        runner = self.state.runner
        try:
            await asyncio.to_thread(runner.grammars.compile, fmt)
        except GrammarError as e:
            raise APIError(400, str(e), param="response_format") from None
        return fmt, ([] if self.req.ignore_eos else list(runner.eos_token_ids)) + list(self.req.stop_token_ids)

    async def start(self) -> None:
        """Submit every choice (n per prompt); raises APIError 429 when the server's queue is full."""
        state, n = self.state, self.req.n
        needed = len(self.prompts) * n
        if needed > state.max_queue:
            raise APIError(400, f"{needed} completions (prompts × n) exceed the server's queue of {state.max_queue}",
                           param="n")
        # Everything that can refuse the request happens before anything is queued.
        grammar = await self._grammar()
        try:
            params = [self._params(j, self.max_tokens[p]) for p in range(len(self.prompts)) for j in range(n)]
        except SpecopsError as e:
            raise APIError(400, str(e)) from None
        # No await from this check to the last submit: concurrent requests cannot overfill the queue.
        check_room(state, needed)
        try:
            for p_idx, prompt in enumerate(self.prompts):
                for j in range(n):
                    idx = p_idx * n + j
                    rid = f"{self.id}-{idx}"
                    state.runner.submit(rid, prompt, params[idx], self._queue, tag=idx, grammar=grammar,
                                        provenance=self.req.provenance)
                    self.choices.append(Choice(idx, p_idx, rid, Detokenizer(state.tokenizer, self.req.stops)))
        except SpecopsError as e:  # shutting down
            for c in self.choices:
                state.runner.abort(c.request_id)
            raise APIError(503, str(e)) from None
        state.metrics.prompt_tokens.labels(state.model_name).inc(self.prompt_tokens)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Settled text per choice as it comes; each choice ends with one delta carrying its finish_reason."""
        try:
            remaining = len(self.choices)
            while remaining:
                ev = await self._queue.get()
                choice = self.choices[ev.tag]
                if choice.done:
                    continue
                if ev.error is not None:
                    choice.done = True
                    raise APIError(400 if ev.client_error else 500, ev.error)
                if ev.token_ids and not self._first_seen:
                    self._first_seen = True
                    self.state.metrics.ttft.labels(self.endpoint).observe(time.monotonic() - self.started_at)
                before = choice.num_tokens
                text = choice.detok.add(ev.token_ids, final=ev.finished)
                self.state.metrics.generated.inc(choice.num_tokens - before)
                if choice.detok.stopped or ev.finished:
                    choice.done = True
                    choice.provenance = ev.provenance
                    remaining -= 1
                    choice.finish_reason = "stop" if choice.detok.stopped else (ev.finish_reason or "stop")
                    if not ev.finished:  # stopped by a stop string: the engine is still decoding it
                        self.state.runner.abort(choice.request_id)
                        self.state.metrics.aborted.inc()
                    yield Delta(choice, text, choice.finish_reason)
                elif text:
                    yield Delta(choice, text, None)
        finally:
            for c in self.choices:
                if not c.done:
                    c.done = True
                    self.state.runner.abort(c.request_id)
                    self.state.metrics.aborted.inc()
