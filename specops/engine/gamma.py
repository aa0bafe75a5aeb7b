"""Choosing γ for every step (``--gamma auto``) from the running batch size and the draft's running acceptance.

A round that drafts γ tokens yields E(γ) = 1 + Σ_{k=1..γ} Π_{j<k} a_j tokens on average, a_j being the chance
draft j is kept once the chain reaches it, and costs R(γ) plain steps: γ·c + v(γ) in the usual model (c one draft
step, v(γ) the verification of γ + 1 tokens, both relative to a plain 1-token step at the same batch size) plus
what that model leaves out (verification, bookkeeping), so R is measured as a whole round rather than summed.
The controller picks the γ with the most tokens per unit of cost, E(γ)/R(γ) (γ = 0 scores 1). It chooses by the
throughput the model predicts, not by an acceptance target: acceptance can stay flat from batch 1 to 32 while the
best γ flips, because the costs change with the batch. R comes from a short calibration at start-up, kept in a
JSON file next to the draft so a restart skips it; the acceptances are running estimates that decay back toward
a prior, so a γ = 0 stretch (which observes nothing) does not freeze them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from specops.errors import SpecopsError
from specops.files import write_atomic


@dataclass
class StepCosts:
    """Per measured batch size: R(γ) for γ = 0..γ_max, a round's time relative to a plain decode step (R(0) = 1)."""

    batch_sizes: list[int]
    rounds: list[list[float]]

    def at(self, batch: int) -> list[float]:
        """The costs of the smallest measured batch size ≥ ``batch`` (the largest beyond them)."""
        i = next((i for i, b in enumerate(self.batch_sizes) if b >= batch), len(self.batch_sizes) - 1)
        return self.rounds[i]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepCosts":
        return cls([int(b) for b in d["batch_sizes"]], [[float(x) for x in r] for r in d["rounds"]])


def expected_tokens(accept: list[float], gamma: int) -> float:
    """E(γ): tokens a round yields when draft k is kept with probability accept[k] once the chain reaches it."""
    total, reach = 1.0, 1.0
    for k in range(gamma):
        reach *= accept[k]
        total += reach
    return total


def predicted_speedup(tokens_per_round: float, gamma: int, c: float, v: float) -> float:
    """Throughput of γ-token speculation over plain decoding in the usual model: a round yields E tokens (the mean
    acceptance length) and costs γ draft steps of ``c`` plus one verification of γ + 1 tokens, ``v``, both relative
    to a plain 1-token target step at the same batch size: E / (γc + v)."""
    return tokens_per_round / (gamma * c + v)


def predicted_serving_speedup(tokens_per_round: float, gamma: int, c: float, v: float, prefill: float,
                              tokens: float, batch: int) -> float:
    """E/(γc + v) with each request's prefill counted: a request costs one prefill (``prefill``, in plain steps of
    this batch size) and ``tokens`` / E rounds shared with ``batch`` - 1 others, against the same prefill and
    ``tokens`` plain steps shared alike. A prefill takes as long with speculation as without, so the larger its
    share of a request (short answers, requests joining a full batch one at a time) the closer to 1 a server's
    speedup stays; with no prefill it is E/(γc + v)."""
    return (prefill + tokens / batch) / (prefill + tokens / batch / predicted_speedup(tokens_per_round, gamma, c, v))


def choose_gamma(accept: list[float], round_cost: list[float], gamma_max: int) -> int:
    """The γ in 0..γ_max with the most tokens per cost, E(γ) / R(γ); ties go to the smaller γ."""
    best, best_rate = 0, 1.0 / round_cost[0]
    for g in range(1, gamma_max + 1):
        rate = expected_tokens(accept, g) / round_cost[g]
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = g, rate
    return best


class AdaptiveGamma:
    """Running per-position acceptance (kept / reached, exponentially decayed toward ``prior``) and the choice. The
    prior is optimistic on purpose: a γ = 0 choice observes nothing, so a pessimistic start could never learn
    that drafting pays."""

    def __init__(self, gamma_max: int, costs: StepCosts, prior: float = 0.8, prior_weight: float = 8.0,
                 decay: float = 0.995):
        self.gamma_max, self.costs, self.decay = gamma_max, costs, decay
        self.prior, self.prior_weight = prior, prior_weight
        self.kept = [0.0] * gamma_max
        self.reached = [0.0] * gamma_max

    def record(self, drafted: int, accepted: int) -> None:
        """One row's round: positions 0..min(accepted, drafted − 1) were reached, the first ``accepted`` kept."""
        for k in range(min(accepted + 1, drafted, self.gamma_max)):
            self.reached[k] += 1
            self.kept[k] += k < accepted

    def acceptance(self) -> list[float]:
        w, p = self.prior_weight, self.prior
        return [(kept + w * p) / (reached + w) for kept, reached in zip(self.kept, self.reached)]

    def choose(self, batch: int) -> int:
        """γ for the next round of ``batch`` rows; each call also ages the estimates by one round."""
        self.kept = [k * self.decay for k in self.kept]
        self.reached = [r * self.decay for r in self.reached]
        return choose_gamma(self.acceptance(), self.costs.at(batch), self.gamma_max)


# -- calibration ---------------------------------------------------------------------------------------------------

CALIBRATION_FILE = "specops-calibration.json"


def calibration_key(runner, gamma_max: int) -> str:
    """What the costs depend on: the machine, the models' shapes and dtype, the batch sizes and γ range."""
    m, d = runner.model.config, runner.draft.cfg
    dev = runner.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    dtype = str(runner.model.model.embed_tokens.weight.dtype).removeprefix("torch.")
    return (f"{name}|{dtype}|torch {torch.__version__}|target {m.hidden_size}x{m.num_hidden_layers}"
            f"|draft {d.hidden_size}|max_batch {runner.scratch}|gamma {gamma_max}|fused {runner.fused}")


def _timed(fn, device, samples: int = 5, min_s: float = 0.004) -> float:
    """Seconds per call: each sample repeats ``fn`` for at least ``min_s``; the fastest sample counts (the work is
    fixed, so anything slower is interference)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)  # noqa: E731
    fn()
    sync()
    best = float("inf")
    for _ in range(samples):
        n, t = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            sync()
            elapsed = time.perf_counter() - t
            if elapsed >= min_s or n >= 200:
                break
        best = min(best, elapsed / n)
    return best


def _round_timer(runner, b: int, context: int, temperature: float = 0.0):
    """A function timing one round of ``b`` rows at ``context`` tokens, verifying w drafts and drafting g, greedy or
    sampling at ``temperature``: as the engine runs it (a CUDA-graph replay where graphs are used, else eager), on
    free slots whose state later prefills overwrite."""
    from specops.engine.model_runner import Mode
    from specops.engine.sampling import SamplingParams

    dev = runner.device
    slots = torch.arange(b, device=dev)
    mode = Mode(sampled=temperature > 0)
    if mode.sampled:
        runner.sampling.admit(list(range(b)), [SamplingParams(temperature=temperature)] * b)

    def timed(w: int, g: int) -> float:
        def one():
            runner.ctx_len[slots] = context  # the same context every time
            if runner.use_graphs:
                runner._replay(b, mode, w, g)
            else:
                runner._round(b, mode, w, g)

        runner.row_slots[:b] = slots
        return _timed(one, dev, samples=3)

    return timed


def _reset(runner) -> None:
    runner.row_slots.fill_(runner.scratch)
    runner.ctx_len.zero_()


def _fastest_rounds(runner, batch_sizes: list[int], steps: list[tuple[int, int]], context: int,
                    temperature: float, passes: int) -> dict[tuple[int, int, int], float]:
    """Seconds of the fastest round per (batch, verified drafts w, new drafts g), each (w, g) of ``steps`` timed in
    each of ``passes`` sweeps over all of them: the first sweep also pays for each new shape's one-off kernel set-up,
    and a moment of interference skews no single figure. Leaves the runner's slots free."""
    best = {(b, w, g): float("inf") for b in batch_sizes for w, g in steps}
    for _ in range(passes):
        for b in batch_sizes:
            timed = _round_timer(runner, b, context, temperature)
            for w, g in steps:
                best[(b, w, g)] = min(best[(b, w, g)], timed(w, g))
    _reset(runner)
    return best


@torch.inference_mode()
def measure_parts(runner, gammas: list[int], batch_sizes: list[int], context: int = 256,
                  temperature: float = 0.0, passes: int = 3) -> list[dict[str, Any]]:
    """The step costs of the speculative-decoding model, per batch size, in milliseconds and relative to a plain
    1-token target step: ``target_ms``; per γ, ``verify_ms``/``v`` (the target forward over γ + 1 tokens with its
    verification, drafting nothing) and ``round_ms`` (the whole round: verify, then draft γ); ``draft_ms``/``c``
    (one draft step: the round's time beyond verification, over γ, at the largest γ). Then γ·c + v(γ) is the
    round's measured cost, and ``predicted_speedup`` turns a measured acceptance length into a throughput ratio.
    With ``temperature`` > 0 every step samples (distributions, the rejection test), which greedy steps skip.
    Each step is the fastest of ``passes`` interleaved sweeps (one sweep once gave v(3) above v(5))."""
    context = min(context, runner.model.rotary.cos.shape[0] - 2 * (max(gammas) + 1))
    steps = [(0, 0)] + [(g, 0) for g in gammas] + [(g, g) for g in gammas]  # (verified drafts, new drafts)
    best = _fastest_rounds(runner, batch_sizes, steps, context, temperature, passes)
    out = []
    for b in batch_sizes:
        target = best[(b, 0, 0)]
        row: dict[str, Any] = {"batch": b, "temperature": temperature, "target_ms": target * 1e3, "verify_ms": {},
                               "round_ms": {}, "v": {}}
        for g in gammas:
            verify_s, round_s = best[(b, g, 0)], best[(b, g, g)]
            row["verify_ms"][g], row["round_ms"][g], row["v"][g] = verify_s * 1e3, round_s * 1e3, verify_s / target
        g = max(gammas)
        draft = max(row["round_ms"][g] - row["verify_ms"][g], 0.0) / g / 1e3
        row["draft_ms"], row["c"] = draft * 1e3, draft / target
        out.append(row)
    return out


@torch.inference_mode()
def measure_prefill(runner, tokens: int, temperature: float = 0.0, cached: int = 0) -> float:
    """Milliseconds of one request's prefill of ``tokens`` prompt tokens (cache writes, first token, first drafts)
    as the engine admits it alone, which is how requests join a loaded server: one as another finishes. On a free
    slot of a runner that serves nothing yet, like the step costs. ``cached``: positions the prompt takes from a
    kept prefix (its copy, then a prefill of the rest, as the prefix cache serves a shared system prompt); 0 times
    the whole prompt."""
    from specops.engine.sampling import SamplingParams

    params = [SamplingParams(temperature=temperature)]
    tokens = min(tokens, runner.model.rotary.cos.shape[0] // 2)
    if not cached or runner.prefixes is None:
        whole = [[1] * tokens]
        call = lambda: runner.prefill([0], whole, params, cached=False).read()  # noqa: E731
    else:
        if not runner.prefixes.min_tokens <= cached < tokens:
            raise ValueError(f"cached positions {cached} must be within [{runner.prefixes.min_tokens}, {tokens})")
        vocab, calls = runner.model.config.vocab_size, iter(range(10**9))
        t = min(set(range(vocab)) - {p.key[0] for p in runner.prefixes.prefixes})  # no prefix kept so far starts so

        def prompt() -> list[list[int]]:  # the shared prefix, then a first token no earlier prompt had here
            return [[t] * (cached + 1) + [(t + 1 + next(calls) % (vocab - 2)) % vocab] + [t] * (tokens - cached - 2)]

        for _ in range(2):  # the second prompt shares cached + 1 tokens with the first: its prefix is kept
            runner.prefill([0], prompt(), params).read()
        assert runner.prefixes.lookup(prompt()[0])[1] == cached
        call = lambda: runner.prefill([0], prompt(), params).read()  # noqa: E731
    ms = _timed(call, runner.device, samples=3) * 1e3
    _reset(runner)
    return ms


@torch.inference_mode()
def measure_costs(runner, gamma_max: int, batch_sizes: list[int], context: int = 256, passes: int = 2) -> StepCosts:
    """Time whole decode rounds (verify γ drafts, draft γ more) for γ = 0..γ_max at each batch size, greedy, as
    the engine runs them (replayed CUDA graphs where it uses them), on the free slots of a runner that serves
    nothing yet (what they write is overwritten by later prefills), at a
    ``context`` of the length of a typical prompt and answer (attention over it grows with γ too). Every
    (batch, γ) is the fastest of ``passes`` interleaved sweeps (``_fastest_rounds``)."""
    context = min(context, runner.model.rotary.cos.shape[0] - 2 * (gamma_max + 1))  # within the caches' room
    best = _fastest_rounds(runner, batch_sizes, [(g, g) for g in range(gamma_max + 1)], context, 0.0, passes)
    rounds = [[best[(b, g, g)] / best[(b, 0, 0)] for g in range(gamma_max + 1)] for b in batch_sizes]
    return StepCosts(list(batch_sizes), rounds)


def load_or_measure(runner, gamma_max: int, batch_sizes: list[int], path: Optional[Path]) -> StepCosts:
    """The costs stored at ``path`` for this machine and these models, else measured now (and stored there when
    the folder is writable; an unreadable file is replaced)."""
    key = calibration_key(runner, gamma_max)
    stored: dict[str, Any] = {}
    if path is not None and path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            stored = {}  # unreadable: measured again and rewritten
        stored = stored if isinstance(stored, dict) else {}
        try:
            if key in stored:
                return StepCosts.from_dict(stored[key])
        except (KeyError, TypeError, ValueError):
            pass  # an entry in an older layout: measured again and replaced
    costs = measure_costs(runner, gamma_max, batch_sizes)
    if path is not None:
        stored[key] = costs.to_dict()
        try:
            write_atomic(path, json.dumps(stored, indent=2, sort_keys=True) + "\n")
        except (OSError, SpecopsError):
            pass  # a read-only model folder or a full disk: measured again on the next start
    return costs
