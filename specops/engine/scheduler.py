"""The scheduler: requests waiting and running, the cache slot each one holds, and the rules that end them.

Requests join free slots between steps and leave when they hit EOS / a stop token / a stop string / max_tokens
(or the context limit). Emitted tokens are appended one by one so that nothing after the stopping token is kept,
however many a speculative round produced.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specops.engine.sampling import SamplingParams
from specops.engine.stats import SpecStats
from specops.errors import SpecopsError

if TYPE_CHECKING:
    from specops.engine.grammar import Constraint


@dataclass
class Output:
    """``provenance`` (when asked for): one record per speculative round after the first token (which the target
    sampled at prefill): ``drafts`` (the γ tokens proposed), ``accepted`` (n: drafts 0..n-1 were kept),
    ``tokens`` (the n + 1 the round produced: the accepted drafts, then at draft position n the target's correction
    of the rejected draft ``drafts[n]``, or after all γ its bonus token) and ``emitted`` (how many of them are in
    the output: fewer when a stop condition cut the round; counters count the whole round, as vLLM's do)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    spec: SpecStats
    provenance: list[dict] | None = None


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    output: Output | None = None  # the complete result, on the step that finishes the request


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    slot: int = -1
    out: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    finish_reason: str | None = None
    text: str | None = None  # set when a stop string ended the request: the output text cut before it
    constraint: Constraint | None = None  # grammar the output must follow (masks target logits and drafts)
    provenance: list[dict] | None = None  # per round, when asked for (see Output)


class Scheduler:
    def __init__(self, max_batch: int, max_seq_len: int, vocab_size: int, eos_token_ids: list[int], tokenizer):
        self.max_seq_len, self.vocab_size = max_seq_len, vocab_size
        self.eos_token_ids, self.tokenizer = eos_token_ids, tokenizer
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self.free_slots = list(range(max_batch))
        self.requests: dict[str, Request] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            constraint: Constraint | None = None, provenance: bool = False) -> None:
        if request_id in self.requests:
            raise SpecopsError(f"duplicate request id {request_id!r}")
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise SpecopsError("empty prompt")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise SpecopsError(f"prompt token ids must lie in [0, {self.vocab_size})")
        if len(prompt) >= self.max_seq_len:
            raise SpecopsError(f"prompt of {len(prompt)} tokens leaves no room under max_seq_len={self.max_seq_len}")
        if params.stop and self.tokenizer is None:
            raise SpecopsError("stop strings need an engine with a tokenizer")
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        req = Request(request_id, prompt, params, frozenset(stop_ids), constraint=constraint,
                      provenance=[] if provenance else None)
        self.requests[request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        if req.slot >= 0:
            self._release(req)
        else:
            self.waiting.remove(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def decoding(self) -> list[Request]:
        """The running requests, in slot order."""
        return [self.running[s] for s in sorted(self.running)]

    def admit(self, limit: tuple[int, int] | None = None, cost=len) -> list[Request]:
        """Waiting requests moved into free slots (lowest first), in arrival order, as many as there are slots; with
        ``limit`` (tokens n, rows r) only as many as one prefill of fewer than n prompt tokens and at most r prompts
        holds (a longer prompt goes alone): the rest wait for the next step. ``cost``: the tokens a prompt's prefill
        computes (fewer than its length when a prefix of it is cached)."""
        admitted, tokens = [], 0
        while self.waiting and self.free_slots:
            if limit is not None and admitted and (tokens + cost(self.waiting[0].prompt) >= limit[0]
                                                   or len(admitted) >= limit[1]):
                break
            req = self.waiting.popleft()
            tokens += cost(req.prompt)
            req.slot = self.free_slots.pop(0)
            self.running[req.slot] = req
            admitted.append(req)
        return admitted

    def emit(self, req: Request, tokens: list[int], outputs: list[StepOutput]) -> int:
        """Append tokens one by one until a stop condition; nothing after the stopping token is kept. Returns how
        many were appended."""
        p = req.params
        limit = min(p.max_tokens, self.max_seq_len - len(req.prompt))
        new = []
        for tok in tokens:
            req.out.append(tok)
            new.append(tok)
            if req.constraint is not None:
                req.constraint.commit([tok])
            if tok in req.stop_ids:
                req.finish_reason = "stop"
            elif p.stop and self._hit_stop_string(req):
                req.finish_reason = "stop"
            elif len(req.out) >= limit:
                req.finish_reason = "length"
            if req.finish_reason is not None:
                break
        if req.finish_reason is None:
            outputs.append(StepOutput(req.request_id, new, False, None))
            return len(new)
        text = req.text if req.text is not None else self.decode_text(req.out)
        out = Output(req.request_id, req.prompt, list(req.out), text, req.finish_reason, req.stats, req.provenance)
        outputs.append(StepOutput(req.request_id, new, True, req.finish_reason, out))
        self.requests.pop(req.request_id, None)
        self._release(req)
        return len(new)

    def decode_text(self, ids: list[int]) -> str:
        """Output text as vLLM returns it (special tokens skipped); empty for an engine built without tokenizer."""
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def _hit_stop_string(self, req: Request) -> bool:
        text = self.decode_text(req.out)
        hits = [i for i in (text.find(s) for s in req.params.stop) if i >= 0]
        if not hits:
            return False
        req.text = text[: min(hits)]
        return True

    def _release(self, req: Request) -> None:
        self.running.pop(req.slot, None)
        self.free_slots.append(req.slot)
        self.free_slots.sort()
        req.slot = -1
