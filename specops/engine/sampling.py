"""Sampling parameters, their per-slot device copy, random numbers, and batched logits → probabilities.

Every row of a batch carries its own temperature / top-k / top-p, applied with tensor ops (no loop over rows).
Randomness is counter-based: the j-th uniform of a request's r-th round is a hash of (seed, r, j) computed on the
device, so a request's output depends on its seed and prompt only, never on which other requests share the
batch, and drawing numbers needs no generator state and no host work inside a step (it can be graph-captured).
Sampling is inverse-CDF on those uniforms, which keeps the random stream independent of the vocabulary order
chosen by any kernel.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from specops.errors import SpecopsError
from specops.models.ops import upload


@dataclass
class SamplingParams:
    """Per-request decoding settings, named as in vLLM. ``temperature == 0`` is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1): no limit
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.temperature < 0:
            raise SpecopsError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SpecopsError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise SpecopsError(f"top_k must be -1, 0 or positive, got {self.top_k}")
        if self.max_tokens < 1:
            raise SpecopsError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise SpecopsError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filters(self) -> bool:
        """Whether top-k or top-p cuts the distribution (a sort over the vocabulary)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1)

    def stream_seed(self) -> int:
        """The seed of the request's random stream: the given one, else fresh system entropy."""
        return (self.seed if self.seed is not None else random.SystemRandom().getrandbits(63)) % (1 << 63)


class SamplingState:
    """Each cache slot's sampling settings and random-stream position, on the device, written when a request is
    admitted; a step gathers its rows' values from here, so it needs nothing from the host."""

    def __init__(self, slots: int, device):
        self.temperature = torch.zeros(slots, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(slots, dtype=torch.long, device=device)
        self.top_p = torch.ones(slots, dtype=torch.float32, device=device)
        self.seed = torch.zeros(slots, dtype=torch.long, device=device)
        self.round = torch.zeros(slots, dtype=torch.long, device=device)  # rounds drawn so far

    def admit(self, slots: list[int], params: list[SamplingParams]) -> None:
        dev = self.seed.device
        idx = upload(slots, torch.long, dev)
        self.temperature[idx] = upload([p.temperature for p in params], torch.float32, dev)
        # A top_k beyond any vocabulary keeps every token, like no limit; capped so any int fits the int64 buffer.
        self.top_k[idx] = upload([min(p.top_k, 1 << 31) for p in params], torch.long, dev)
        self.top_p[idx] = upload([p.top_p for p in params], torch.float32, dev)
        self.seed[idx] = upload([p.stream_seed() for p in params], torch.long, dev)
        self.round.index_fill_(0, idx, 0)

    def rows(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """temperature, top_k, top_p of the given slots."""
        return self.temperature[slots], self.top_k[slots], self.top_p[slots]

    def draw(self, slots: torch.Tensor, n: int) -> torch.Tensor:
        """The slots' next round of ``n`` uniforms [len(slots), n], advancing their streams by one round."""
        u = uniforms(self.seed[slots], self.round[slots], n)
        self.round[slots] += 1
        return u


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32) on int64 tensors holding values below 2³²: every product stays
    below 2⁶³, so it is exact and the same on every device."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def uniforms(seeds: torch.Tensor, rounds: torch.Tensor, n: int) -> torch.Tensor:
    """Uniforms in [0, 1) [B, n]: element j of row b hashes (seeds[b], rounds[b], j); 24 random bits each."""
    h = _mix32(seeds & _M32)
    h = _mix32(h ^ ((seeds >> 32) & _M32))
    h = _mix32((h + (rounds & _M32) * 0x9E3779B9) & _M32)
    j = torch.arange(n, dtype=torch.long, device=seeds.device)
    x = _mix32((h.unsqueeze(-1) + (j + 1) * 0x85EBCA6B) & _M32)
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


def logits_to_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, filtering: bool = True
) -> torch.Tensor:
    """Distribution a sampler draws from, row by row.

    logits: [B, ..., V]; temperature, top_k, top_p: [B] (greedy rows: temperature 0 → one-hot argmax; top_k <= 0:
    no limit). Order as in vLLM: temperature, then top-k, then top-p over the renormalised top-k set (the smallest
    set of most likely tokens whose mass reaches top_p; the most likely token is always kept). ``filtering``
    False (the caller knows no row cuts) skips the sort. A row's result never depends on the other rows of the
    batch, and nothing here reads a value back to the host.
    """
    b, v = logits.shape[0], logits.shape[-1]
    shape = (b,) + (1,) * (logits.dim() - 1)
    logits = logits.float()
    greedy = temperature == 0
    onehot = torch.zeros_like(logits).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).view(shape).float()
    scaled = logits / temp
    probs = scaled.softmax(dim=-1)
    if filtering:
        filtered = ((top_k > 0) & (top_k < v) | (top_p < 1)) & ~greedy
        probs = torch.where(filtered.view(shape), _filtered_probs(scaled, top_k, top_p), probs)
    return torch.where(greedy.view(shape), onehot, probs)


def _filtered_probs(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p over sorted scaled logits [B, ..., V], renormalised and scattered back to vocab order."""
    b, v = scaled.shape[0], scaled.shape[-1]
    shape = (b,) + (1,) * (scaled.dim() - 1)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(v, device=scaled.device)
    k = torch.where(top_k <= 0, torch.full_like(top_k, v), top_k).view(shape)
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep = (mass_before < top_p.view(shape).float()) | (rank == 0)
    sorted_probs = sorted_probs * keep
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample: probs [..., V] (need not be normalised), u [...] uniform in [0, 1) → ids [...]."""
    cdf = probs.cumsum(dim=-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)
    # u·total can round up to total; fall back to the last token with mass rather than a zero-probability one.
    last = ((probs > 0) * torch.arange(probs.shape[-1], device=probs.device)).argmax(dim=-1, keepdim=True)
    idx = torch.where(probs.gather(-1, idx) > 0, idx, last)
    return idx.squeeze(-1)


def mask_logits_(logits: torch.Tensor, allowed: torch.Tensor, keep_unsatisfiable: bool = False) -> torch.Tensor:
    """Set disallowed logits to -inf in place; ``allowed`` ([..., V] bool) broadcasts over ``logits``.

    ``keep_unsatisfiable``: a row none of whose allowed tokens has a finite logit is left as it was. Drafts use it:
    when the draft vocabulary holds no allowed token the proposal stays free and verification rejects it (any
    draft distribution keeps verification lossless), rather than a row of -inf that cannot be sampled."""
    allowed = allowed.to(logits.device)
    if not keep_unsatisfiable:
        return logits.masked_fill_(~allowed, float("-inf"))
    masked = logits.masked_fill(~allowed, float("-inf"))
    return logits.copy_(torch.where(torch.isfinite(masked).any(dim=-1, keepdim=True), masked, logits))
