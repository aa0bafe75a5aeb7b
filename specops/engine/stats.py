"""Speculative-decoding counters with vLLM's definitions, per request and in total.

A draft is one proposal of γ tokens for one request; accepted tokens are counted before stop conditions cut the
output, as vLLM's scheduler does. acceptance rate = accepted / draft tokens; mean acceptance length =
1 + accepted / drafts; per-position rate = accepted_per_pos[i] / drafts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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

    def merge(self, other: "SpecStats") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        self.accepted_per_pos = [
            (self.accepted_per_pos[i] if i < len(self.accepted_per_pos) else 0)
            + (other.accepted_per_pos[i] if i < len(other.accepted_per_pos) else 0)
            for i in range(n)
        ]

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def per_position_rate(self) -> list[float]:
        return [a / self.num_drafts for a in self.accepted_per_pos] if self.num_drafts else []

    def to_dict(self) -> dict:
        d = asdict(self)
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_acceptance_length"] = self.mean_acceptance_length
        return d
