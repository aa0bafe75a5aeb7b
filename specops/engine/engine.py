"""The engine: plain decoding (γ = 0) or lossless EAGLE-3 speculative decoding with continuous batching.

It joins the three parts of a step: the scheduler decides which requests run and ends them, the model runner
runs the forwards (prefill for new requests, one verify-and-draft round for the others), and the stats count
drafts and acceptances. Per step at most one prefill and one round run, each a single batched forward plus
the drafter's steps, whatever the number of requests.

With ``overlap`` (the default on CUDA) a step queues the next round on the device before it reads the result of
the round queued by the step before, so the device never waits for the host's bookkeeping; a request's output
then arrives one step after its round ran, and a request that finished gets one more round nobody reads. A
prefill is read one step late too: its requests join the next round (the device holds their first tokens) before
the host has seen their first token.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specops.engine.config import EngineConfig, GammaSchedule, gamma_at, parse_gamma_schedule, schedule_gamma
from specops.engine.gamma import CALIBRATION_FILE, AdaptiveGamma, load_or_measure
from specops.engine.model_runner import Mode, ModelRunner, Pending, buckets
from specops.engine.sampling import SamplingParams
from specops.engine.scheduler import Output, Request, Scheduler, StepOutput
from specops.engine.stats import SpecStats
from specops.errors import SpecopsError
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaForCausalLM, fuse_projections
from specops.models.target import eos_token_ids, load_target, load_tokenizer

if TYPE_CHECKING:
    from specops.engine.grammar import Constraint

__all__ = ["Engine", "Output", "StepOutput"]

PREFIX_SLOTS = 4  # cache slots for shared prompt prefixes (a task's system prompt needs one)


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
        cuda_graphs: bool = True,
        bucket_padding: bool | None = None,
        overlap: bool | None = None,
        forced_tokens: int = 0,
        adaptive_gamma: bool = False,
        calibration: Path | None = None,
        gamma_schedule: GammaSchedule | None = None,
        prefix_cache: bool = True,
    ):
        """``cuda_graphs``: capture rounds as CUDA graphs where the fused kernels run (CUDA); ``bucket_padding``:
        pad batches to the graph buckets (default: exactly when graphs are used); ``overlap``: queue each round
        before reading the previous one (default: on CUDA); ``forced_tokens``: schema-aware drafting, the most
        schema-forced tokens a constrained request drafts beyond γ per round (0: off; without a draft, forced
        tokens alone); ``adaptive_gamma``: choose γ in 0..``gamma`` every step (``engine.gamma``), with the step
        costs read from or measured into ``calibration`` (a JSON file; None: measured, not kept);
        ``gamma_schedule``: γ by running batch size instead (``config.parse_gamma_schedule``), each at most ``gamma``;
        ``prefix_cache``: keep the keys and values of prompt prefixes that requests share, and prefill only the rest
        of a prompt that starts with one (``engine.prefix_cache``)."""
        if gamma < 0:
            raise SpecopsError(f"gamma must be >= 0, got {gamma}")
        if gamma_schedule is not None and schedule_gamma(gamma_schedule) > gamma:
            raise SpecopsError(f"gamma_schedule drafts up to {schedule_gamma(gamma_schedule)} tokens, more than "
                               f"gamma = {gamma}")
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
        self.runner = ModelRunner(model, self.draft, self.gamma, max_batch, max_seq_len, cuda_graphs, bucket_padding,
                                  forced_tokens, PREFIX_SLOTS if prefix_cache else 0)
        self.speculative = self.draft is not None or forced_tokens > 0  # outputs carry acceptance counters
        self.gamma_schedule = gamma_schedule if self.draft is not None else None
        self.controller = None
        if adaptive_gamma and self.draft is not None:
            costs = load_or_measure(self.runner, self.gamma, buckets(max_batch), calibration)
            self.controller = AdaptiveGamma(self.gamma, costs)
        if self.controller is not None:
            steady = range(self.gamma + 1)
        else:
            steady = sorted({g for *_, g in self.gamma_schedule}) if self.gamma_schedule else [self.gamma]
        self.runner.capture_all(steady)
        self.scheduler = Scheduler(max_batch, max_seq_len, self.vocab_size, self.eos_token_ids, tokenizer)
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        self._inflight: tuple[list[Request], Pending] | None = None  # a round queued, its result not read yet
        self._admitting: tuple[list[Request], Pending] | None = None  # a prefill queued, its first tokens not read
        self.stats = SpecStats()
        self._ids = itertools.count()
        self._grammars = None  # compiled on first use by ``constraint``

    @classmethod
    def from_config(cls, cfg: EngineConfig, draft_model: Eagle3Draft | None = None) -> "Engine":
        """Load what ``cfg`` names; ``draft_model`` (an EAGLE-3 draft already built) stands in for ``cfg.draft``."""
        cfg.validate()
        gamma = cfg.gamma if (cfg.draft is not None or draft_model is not None) else 0
        capacity = cfg.max_seq_len + 3 * (gamma + cfg.forced_tokens) + 2
        draft_dir = cfg.draft if cfg.draft is not None and draft_model is None else None
        model, _ = load_target(cfg.model, lora=cfg.lora, lora_mode=cfg.lora_mode, device=cfg.device,
                               dtype=cfg.torch_dtype, max_len=capacity)
        tokenizer = load_tokenizer(cfg.model, model.config.vocab_size)
        draft = draft_model
        if draft is None and cfg.draft is not None and gamma:
            draft = fuse_projections(Eagle3Draft.load(cfg.draft, model, max_len=capacity))
        fuse_projections(model)
        return cls(model, tokenizer, draft=draft, gamma=gamma, max_batch=cfg.max_batch, max_seq_len=cfg.max_seq_len,
                   eos_token_ids=eos_token_ids(cfg.model, model, tokenizer), cuda_graphs=cfg.cuda_graphs,
                   forced_tokens=cfg.forced_tokens, adaptive_gamma=cfg.adaptive_gamma,
                   calibration=None if draft_dir is None else Path(draft_dir) / CALIBRATION_FILE,
                   gamma_schedule=cfg.gamma_schedule, prefix_cache=cfg.prefix_cache)

    @classmethod
    def load(cls, model_dir: str | Path, draft: str | Path | Eagle3Draft | None = None, **settings) -> "Engine":
        """``from_config`` with the settings as keywords (see EngineConfig); ``draft`` may be a built draft."""
        if isinstance(draft, Eagle3Draft):
            return cls.from_config(EngineConfig(Path(model_dir), **settings), draft_model=draft)
        return cls.from_config(EngineConfig(Path(model_dir), draft=None if draft is None else Path(draft), **settings))

    # -- request lifecycle --------------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    constraint: Constraint | None = None, provenance: bool = False) -> None:
        """Queue a request. ``provenance``: record where each output token came from (``Output.provenance``)."""
        self.scheduler.add(request_id, prompt_token_ids, params, constraint, provenance)

    def constraint(self, response_format: dict) -> Constraint:
        """A fresh grammar constraint for one request (``response_format`` as in the OpenAI API), ending on EOS."""
        if self._grammars is None:
            from specops.engine.grammar import Grammars

            self._grammars = Grammars(self.tokenizer, self.vocab_size)
        return self._grammars.constraint(response_format, self.eos_token_ids)

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """Admit waiting requests (prefill, first token, first drafts) and advance the others by one round."""
        outputs: list[StepOutput] = []
        previous, self._inflight = self._inflight, None
        admitting, self._admitting = self._admitting, None
        decoding = self.scheduler.decoding()
        constraints = _constraints(decoding)
        overlapped = bool(decoding) and self.overlap and constraints is None
        if overlapped:  # queue this round before reading the last one
            self._inflight = decoding, self._launch(decoding, None)
        if admitting is not None:  # first tokens before the tokens of any round that ran after them
            self._first_tokens(*admitting, outputs)
        if previous is not None:
            self._finish(*previous, outputs)
        admitted = self.scheduler.admit(self.runner.prefill_limit, self.runner.uncached)
        if admitted:
            admit_constraints = _constraints(admitted)
            pending = self.runner.prefill([r.slot for r in admitted], [r.prompt for r in admitted],
                                          [r.params for r in admitted], admit_constraints,
                                          self._gamma_for(len(self.scheduler.running)))
            if self.overlap and admit_constraints is None:
                self._admitting = admitted, pending
            else:
                self._first_tokens(admitted, pending, outputs)
        if decoding and not overlapped and previous is None:
            # Without the slots of requests that ended on their first token: they may belong to new requests now.
            decoding = [r for r in decoding if self.scheduler.running.get(r.slot) is r]
            if decoding:
                self._finish(decoding, self._launch(decoding, _constraints(decoding)), outputs)
        return outputs

    def _first_tokens(self, admitted: list[Request], pending: Pending, outputs: list[StepOutput]) -> None:
        """Emit a prefill's first tokens for the requests still running (not aborted since)."""
        for r, tok in zip(admitted, pending.read()):
            if self.scheduler.running.get(r.slot) is r:
                self.scheduler.emit(r, [tok], outputs)

    def _launch(self, reqs: list[Request], constraints: list | None) -> Pending:
        return self.runner.launch([r.slot for r in reqs], Mode.of([r.params for r in reqs]), constraints,
                                  self._gamma_for(len(reqs)))

    def use_gamma_schedule(self, schedule: GammaSchedule) -> None:
        """Draft by ``schedule`` (``config.parse_gamma_schedule``; a fixed γ is the one range ``[[1, max_batch, γ]]``)
        from the next round on, up to the engine's γ: how one running server measures γ tables side by side, free of
        the spread between two servers. Rounds of the new γ values are captured here, before any runs them; requests
        in flight keep their drafts and verify them in the next round, as when a schedule switches γ."""
        schedule = parse_gamma_schedule(schedule)
        if self.draft is None:
            raise SpecopsError("this engine has no draft model: it decodes without speculation at any γ")
        if self.controller is not None:
            raise SpecopsError("this engine chooses γ itself (--gamma auto)")
        if schedule_gamma(schedule) > self.gamma:
            raise SpecopsError(f"the γ schedule drafts up to {schedule_gamma(schedule)} tokens, more than this "
                               f"engine's γ = {self.gamma}")
        used = {g for *_, g in self.gamma_schedule} if self.gamma_schedule else {self.gamma}
        self.runner.capture_all(sorted(used | {g for *_, g in schedule}))
        self.gamma_schedule = schedule

    def _gamma_for(self, batch: int) -> int:
        """γ for a round of ``batch`` rows: fixed, the schedule's for that batch size, or the controller's choice
        with ``--gamma auto``."""
        if self.controller is not None:
            return self.controller.choose(batch)
        return self.gamma if self.gamma_schedule is None else gamma_at(self.gamma_schedule, batch)

    def _finish(self, reqs: list[Request], pending: Pending, outputs: list[StepOutput]) -> None:
        """Read a round's result and emit it for the requests that are still running (not finished or aborted
        since the round was queued)."""
        result = self.runner.collect(pending)
        for r, k, toks, drafts in zip(reqs, result.accepted, result.tokens, result.drafts):
            if self.scheduler.running.get(r.slot) is not r:
                continue
            r.stats.record(len(drafts), k)  # forced drafts count like any other, as vLLM counts them
            self.stats.record(len(drafts), k)
            if self.controller is not None:
                self.controller.record(len(drafts), k)
            if r.provenance is not None:
                r.provenance.append({"drafts": drafts, "accepted": k, "tokens": toks[: k + 1], "emitted": 0})
            emitted = self.scheduler.emit(r, toks[: k + 1], outputs)
            if r.provenance is not None:
                r.provenance[-1]["emitted"] = emitted

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], progress: bool = False,
                 provenance: bool = False, response_format: dict | None = None) -> list[Output]:
        """Decode every prompt to the end; ``response_format`` (json_schema / json_object) constrains them all."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise SpecopsError(f"{len(params)} sampling params for {len(prompts)} prompts")
        ids = [f"generate-{next(self._ids)}" for _ in prompts]
        for rid, prompt, p in zip(ids, prompts, params):
            c = self.constraint(response_format) if response_format is not None else None
            self.add_request(rid, prompt, p, constraint=c, provenance=provenance)
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


def _constraints(reqs) -> list | None:
    """Each request's grammar constraint, or None when none has one."""
    return [r.constraint for r in reqs] if any(r.constraint is not None for r in reqs) else None
