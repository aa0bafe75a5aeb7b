"""Speculative-decoding counters with vLLM's definitions: the one type for the engine's per-request and total
counts, for counters scraped from any server's /metrics, and for the acceptance figures of a benchmark.

A draft is one proposal of γ tokens for one request; accepted tokens are counted before stop conditions cut the
output, as vLLM's scheduler does. acceptance rate = accepted / draft tokens; mean acceptance length =
1 + accepted / drafts; per-position rate = accepted_per_pos[i] / drafts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SpecStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One verification of ``num_draft_tokens`` drafts of which the first ``num_accepted`` were kept."""
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft_tokens:
            self.accepted_per_pos += [0] * (num_draft_tokens - len(self.accepted_per_pos))
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpecStats":
        """From the four counters (extra keys, such as the derived rates of ``to_dict``, are ignored)."""
        return cls(int(d["num_drafts"]), int(d["num_draft_tokens"]), int(d["num_accepted_tokens"]),
                   [int(x) for x in d["accepted_per_pos"]])

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Add ``other``'s counts to these; returns self."""
        self._combine(other, 1)
        return self

    def since(self, before: "SpecStats") -> "SpecStats":
        """Counts accumulated between an earlier snapshot ``before`` of cumulative counters and this one."""
        return SpecStats(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                         list(self.accepted_per_pos))._combine(before, -1)

    def _combine(self, other: "SpecStats", sign: int) -> "SpecStats":
        self.num_drafts += sign * other.num_drafts
        self.num_draft_tokens += sign * other.num_draft_tokens
        self.num_accepted_tokens += sign * other.num_accepted_tokens
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        mine = self.accepted_per_pos + [0] * (n - len(self.accepted_per_pos))
        theirs = other.accepted_per_pos + [0] * (n - len(other.accepted_per_pos))
        self.accepted_per_pos = [a + sign * b for a, b in zip(mine, theirs)]
        return self

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def per_position_rate(self) -> list[float]:
        return [a / self.num_drafts for a in self.accepted_per_pos] if self.num_drafts else []

    def counters(self) -> dict[str, Any]:
        """The four counters alone (what a run store keeps; the rates follow from them)."""
        return asdict(self)

    def to_dict(self, per_position: bool = False) -> dict[str, Any]:
        """The counters with the acceptance rate and mean acceptance length (and the per-position rates)."""
        d = asdict(self)
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_acceptance_length"] = self.mean_acceptance_length
        if per_position:
            d["per_position_rate"] = self.per_position_rate()
        return d
