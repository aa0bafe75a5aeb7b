"""Continuous-batching engine: plain decoding (γ = 0) or lossless EAGLE-3 speculative decoding.

Requests join free cache slots between steps and leave when they hit EOS / a stop token / a stop string /
max_tokens. Per step, one batched target forward verifies every running request's last token plus its γ drafts
(γ = 0: just the last token), the rejection sampler decides all rows at once, and the proposer drafts the next γ
tokens from the verified positions' taps. State between steps lives in per-slot tensors: the token not yet in the
cache, the cache length, and the pending drafts with the distributions they were drawn from.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specops.engine.config import EngineConfig
from specops.engine.proposer import Eagle3Proposer
from specops.engine.sampling import SamplingParams, logits_to_probs, mask_logits_, sample_from
from specops.engine.stats import SpecStats
from specops.engine.verify import verify
from specops.errors import SpecopsError
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaForCausalLM, Rotary, fuse_projections
from specops.models.target import eos_token_ids, load_target, load_tokenizer

if TYPE_CHECKING:
    from specops.engine.grammar import Constraint


@dataclass
class Output:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    spec: SpecStats


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    output: Output | None = None  # the complete result, on the step that finishes the request


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    stop_ids: frozenset[int]
    slot: int = -1
    out: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    finish_reason: str | None = None
    text: str | None = None  # set when a stop string ended the request: the output text cut before it
    constraint: Constraint | None = None  # grammar the output must follow (masks target logits and drafts)


class Engine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer,
        *,
        draft: Eagle3Draft | None = None,
        gamma: int = 3,
        max_batch: int = 16,
        max_seq_len: int = 1024,
        eos_token_ids: list[int] | None = None,
    ):
        if gamma < 0:
            raise SpecopsError(f"gamma must be >= 0, got {gamma}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.gamma = gamma if draft is not None else 0
        self.draft = draft.attach(model).eval() if draft is not None and self.gamma else None
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        cfg = model.config
        if cfg.sliding_window and max_seq_len > cfg.sliding_window:
            raise SpecopsError(
                f"max_seq_len={max_seq_len} exceeds the model's sliding window ({cfg.sliding_window}); "
                "only full attention is implemented, so keep max_seq_len within the window"
            )
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = sorted(set(eos_token_ids if eos_token_ids is not None else cfg.eos_token_id))
        self.device = model.model.embed_tokens.weight.device
        # Verification writes γ + 1 positions past the context and drafting γ more: room for both past max_seq_len.
        capacity = max_seq_len + 2 * self.gamma + 2
        for m in (model, self.draft):
            if m is not None and m.rotary.cos.shape[0] < capacity:
                m.rotary = Rotary(m.config if m is model else m.cfg, capacity).to(self.device)
        self.cache = model.new_cache(max_batch, capacity)
        self.tap_layers = self.draft.tap_layers if self.draft is not None else ()
        self.proposer = Eagle3Proposer(self.draft, self.gamma, max_batch, capacity) if self.draft is not None else None
        s, g = max_batch, self.gamma
        self.last_token = torch.zeros(s, dtype=torch.long, device=self.device)
        self.ctx_len = torch.zeros(s, dtype=torch.long, device=self.device)
        self.drafts = torch.zeros(s, g, dtype=torch.long, device=self.device)
        self.draft_probs = torch.zeros(s, g, self.vocab_size, dtype=torch.float32, device=self.device)
        self.waiting: deque[_Request] = deque()
        self.running: dict[int, _Request] = {}
        self.free_slots = list(range(max_batch))
        self.requests: dict[str, _Request] = {}
        self.stats = SpecStats()
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, cfg: EngineConfig, draft_model: Eagle3Draft | None = None) -> "Engine":
        """Load what ``cfg`` names; ``draft_model`` (an EAGLE-3 draft already built) stands in for ``cfg.draft``."""
        cfg.validate()
        gamma = cfg.gamma if (cfg.draft is not None or draft_model is not None) else 0
        capacity = cfg.max_seq_len + 2 * gamma + 2
        model, _ = load_target(cfg.model, lora=cfg.lora, lora_mode=cfg.lora_mode, device=cfg.device,
                               dtype=cfg.torch_dtype, max_len=capacity)
        tokenizer = load_tokenizer(cfg.model, model.config.vocab_size)
        draft = draft_model
        if draft is None and cfg.draft is not None and gamma:
            draft = fuse_projections(Eagle3Draft.load(cfg.draft, model, max_len=capacity))
        fuse_projections(model)
        return cls(model, tokenizer, draft=draft, gamma=gamma, max_batch=cfg.max_batch, max_seq_len=cfg.max_seq_len,
                   eos_token_ids=eos_token_ids(cfg.model, model, tokenizer))

    @classmethod
    def load(cls, model_dir: str | Path, draft: str | Path | Eagle3Draft | None = None, **settings) -> "Engine":
        """``from_config`` with the settings as keywords (see EngineConfig); ``draft`` may be a built draft."""
        if isinstance(draft, Eagle3Draft):
            return cls.from_config(EngineConfig(Path(model_dir), **settings), draft_model=draft)
        return cls.from_config(EngineConfig(Path(model_dir), draft=None if draft is None else Path(draft), **settings))

    # -- request lifecycle --------------------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, constraint: Constraint | None = None
    ) -> None:
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
        req = _Request(request_id, prompt, params, params.generator(), frozenset(stop_ids), constraint=constraint)
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

    def step(self) -> list[StepOutput]:
        """Admit waiting requests (prefill, first token, first drafts), then advance the others by one round."""
        outputs: list[StepOutput] = []
        decoding = [self.running[s] for s in sorted(self.running)]  # slot order: consecutive slots read as views
        if self.waiting and self.free_slots:
            self._prefill(outputs)
        if decoding:
            self._decode(decoding, outputs)
        return outputs

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], progress: bool = False
    ) -> list[Output]:
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise SpecopsError(f"{len(params)} sampling params for {len(prompts)} prompts")
        ids = [f"generate-{next(self._ids)}" for _ in prompts]
        for rid, prompt, p in zip(ids, prompts, params):
            self.add_request(rid, prompt, p)
        done: dict[str, Output] = {}
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(prompts), unit="req")
        while len(done) < len(ids):
            for so in self.step():
                if so.finished and so.output is not None:
                    done[so.request_id] = so.output
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [done[r] for r in ids]

    # -- batched steps ------------------------------------------------------------------------------------------

    def _params(self, reqs: list[_Request]):
        dev = self.device
        temperature = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32, device=dev)
        top_k = torch.tensor([r.params.top_k for r in reqs], dtype=torch.long, device=dev)
        top_p = torch.tensor([r.params.top_p for r in reqs], dtype=torch.float32, device=dev)
        return temperature, top_k, top_p

    def _uniforms(self, reqs: list[_Request], n: int) -> torch.Tensor:
        """n uniforms per request from its own generator: the stream depends on the request alone."""
        return torch.stack([torch.rand(n, generator=r.generator) for r in reqs]).to(self.device)

    @torch.inference_mode()
    def _prefill(self, outputs: list[StepOutput]) -> None:
        reqs = []
        while self.waiting and self.free_slots:
            req = self.waiting.popleft()
            req.slot = self.free_slots.pop(0)
            self.running[req.slot] = req
            reqs.append(req)
        b, g, dev = len(reqs), self.gamma, self.device
        lens = torch.tensor([len(r.prompt) for r in reqs], device=dev)
        t = int(lens.max())
        tokens = torch.zeros(b, t, dtype=torch.long, device=dev)
        for i, r in enumerate(reqs):
            tokens[i, : len(r.prompt)] = torch.tensor(r.prompt, device=dev)
        positions = torch.arange(t, device=dev).expand(b, t)
        slots = torch.tensor([r.slot for r in reqs], device=dev)
        logits, taps = self.model(tokens, positions, self.cache, slots, self.tap_layers, logits_at=lens - 1)
        rows = torch.arange(b, device=dev)
        temperature, top_k, top_p = self._params(reqs)
        greedy_only = all(r.params.greedy for r in reqs)
        u = None if greedy_only else self._uniforms(reqs, 1 + g)
        last = logits[:, 0]
        for i, r in enumerate(reqs):
            if r.constraint is not None:
                mask_logits_(last[i], r.constraint.mask())
        if greedy_only:
            first = last.argmax(dim=-1)
        else:
            first = sample_from(logits_to_probs(last, temperature, top_k, top_p), u[:, 0])  # greedy rows: one-hot
        self.ctx_len[slots] = lens
        self.last_token[slots] = first
        if self.proposer is not None:
            shifted = torch.cat([tokens[:, 1:], tokens.new_zeros(b, 1)], dim=1)
            shifted[rows, lens - 1] = first
            guides = _guides(reqs, [[t] for t in first.tolist()])
            d, q = self.proposer.propose(shifted, taps, positions, lens - 1, slots, temperature, top_k, top_p,
                                         None if u is None else u[:, 1:], guides)
            self._store_drafts(slots, d, q)
        for r, tok in zip(reqs, first.tolist()):
            self._emit(r, [tok], outputs)

    @torch.inference_mode()
    def _decode(self, reqs: list[_Request], outputs: list[StepOutput]) -> None:
        b, g, dev = len(reqs), self.gamma, self.device
        slots = torch.tensor([r.slot for r in reqs], device=dev)
        drafts = self.drafts[slots]
        tokens = torch.cat([self.last_token[slots].unsqueeze(1), drafts], dim=1)
        positions = self.ctx_len[slots].unsqueeze(1) + torch.arange(g + 1, device=dev)
        logits, taps = self.model(tokens, positions, self.cache, slots, self.tap_layers)
        for i, r in enumerate(reqs):
            if r.constraint is not None:  # before verification: lossless w.r.t. the constrained distribution
                mask_logits_(logits[i], r.constraint.verification_masks(drafts[i].tolist()))
        temperature, top_k, top_p = self._params(reqs)
        if all(r.params.greedy for r in reqs):  # no distributions or random draws needed
            n, out = verify(logits, None, drafts, None, temperature == 0, None, None)
            u_draft = None
        else:
            probs = logits_to_probs(logits, temperature, top_k, top_p)
            u = self._uniforms(reqs, 2 * g + 1)
            n, out = verify(logits, probs, drafts, self.draft_probs[slots], temperature == 0, u[:, :g], u[:, g])
            u_draft = u[:, g + 1 :]
        rows = torch.arange(b, device=dev)
        self.ctx_len[slots] += n + 1
        self.last_token[slots] = out[rows, n]
        if self.proposer is not None:
            emitted = [row[: k + 1] for row, k in zip(out.tolist(), n.tolist())]
            d, q = self.proposer.propose(out, taps, positions, n, slots, temperature, top_k, top_p, u_draft,
                                         _guides(reqs, emitted))
            self._store_drafts(slots, d, q)
        for r, k, toks in zip(reqs, n.tolist(), out.tolist()):
            r.stats.record(g, k)
            self.stats.record(g, k)
            self._emit(r, toks[: k + 1], outputs)

    def _store_drafts(self, slots: torch.Tensor, drafts: torch.Tensor, probs: torch.Tensor | None) -> None:
        """Pending drafts for the next verification; their distributions only matter to sampling rows."""
        self.drafts[slots] = drafts
        if probs is not None:
            self.draft_probs[slots] = probs

    # -- stop conditions ----------------------------------------------------------------------------------------

    def _emit(self, req: _Request, tokens: list[int], outputs: list[StepOutput]) -> None:
        """Append tokens one by one until a stop condition; nothing after the stopping token is kept."""
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
            return
        text = req.text if req.text is not None else self._decode_text(req.out)
        out = Output(req.request_id, req.prompt, list(req.out), text, req.finish_reason, req.stats)
        outputs.append(StepOutput(req.request_id, new, True, req.finish_reason, out))
        self.requests.pop(req.request_id, None)
        self._release(req)

    def _decode_text(self, ids: list[int]) -> str:
        """Output text as vLLM returns it (special tokens skipped); empty for an engine built without tokenizer."""
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def _hit_stop_string(self, req: _Request) -> bool:
        text = self._decode_text(req.out)
        hits = [i for i in (text.find(s) for s in req.params.stop) if i >= 0]
        if not hits:
            return False
        req.text = text[: min(hits)]
        return True

    def _release(self, req: _Request) -> None:
        self.running.pop(req.slot, None)
        self.free_slots.append(req.slot)
        self.free_slots.sort()
        req.slot = -1


def _guides(reqs: list[_Request], pending: list[list[int]]) -> list | None:
    """Per-row grammar cursors for the draft chain (after the tokens emitted this step), or None if unconstrained."""
    if all(r.constraint is None for r in reqs):
        return None
    return [r.constraint.drafting(p) if r.constraint is not None else None for r, p in zip(reqs, pending)]
