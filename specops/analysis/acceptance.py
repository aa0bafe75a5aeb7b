"""Acceptance by token class, schema field and draft position, from the engine's per-round provenance.

Every draft position a round reaches is attributed to the token the target emitted there: position p < n (n
accepted) is the accepted draft token at p, position n < the round's draft count is the target's correction of the
rejected draft (rounds draft γ tokens, or more with schema-aware drafting; a round that drafted none is skipped);
positions after n are not reached and count in neither. So per class, accepted + rejected counts every reached
position once, the accepted counts sum to the engine's ``num_accepted_tokens`` exactly, and the rejected counts to
the number of rounds that rejected a draft. Positions past a stop (the round produced them, the output was cut
before them) have the class ``after stop``.

Rates: per position, accepted at p / rounds (vLLM's per-position rate); per class and per field, accepted /
(accepted + rejected): the chance the draft is kept when the chain reaches a token of that kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from specops.analysis.json_lexer import SCHEMA

AFTER_STOP = "after stop"


@dataclass
class Tally:
    gamma: int
    rounds: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    accepted: Counter = field(default_factory=Counter)  # by class
    rejected: Counter = field(default_factory=Counter)
    field_accepted: Counter = field(default_factory=Counter)  # by schema field
    field_rejected: Counter = field(default_factory=Counter)
    cell_accepted: Counter = field(default_factory=Counter)  # by (class, position)
    cell_rejected: Counter = field(default_factory=Counter)

    draft_tokens: int = 0

    def __post_init__(self):
        self.accepted_per_pos = self.accepted_per_pos or [0] * self.gamma

    def add(self, token_classes: list[tuple[str, str | None]], rounds: list[dict]) -> None:
        """One answer: its tokens' (class, field) and its provenance rounds (``engine.scheduler.Output``)."""
        offset = 1  # the first output token comes from the prefill, not from a round
        for r in rounds:
            n, width, start = r["accepted"], len(r["drafts"]), offset
            offset += r["emitted"]
            if not width:  # nothing was drafted: not a round of speculation (the engine's counters skip it too)
                continue
            self.rounds += 1
            self.draft_tokens += width
            self.accepted_per_pos += [0] * (width - len(self.accepted_per_pos))
            for p in range(min(n + 1, width)):
                idx = start + p
                cls, fld = token_classes[idx] if idx < len(token_classes) else (AFTER_STOP, None)
                if p < n:
                    self.accepted_per_pos[p] += 1
                    self.accepted[cls] += 1
                    self.cell_accepted[(cls, p)] += 1
                    if fld:
                        self.field_accepted[fld] += 1
                else:
                    self.rejected[cls] += 1
                    self.cell_rejected[(cls, p)] += 1
                    if fld:
                        self.field_rejected[fld] += 1

    @property
    def num_accepted(self) -> int:
        return sum(self.accepted_per_pos)

    def summary(self) -> dict:
        rate = lambda a, r: a / (a + r) if a + r else None  # noqa: E731
        classes = sorted(set(self.accepted) | set(self.rejected))
        fields = sorted(set(self.field_accepted) | set(self.field_rejected))
        rejected = sum(self.rejected.values())
        schema = sum(self.rejected[c] for c in SCHEMA)
        return {
            "gamma": self.gamma, "rounds": self.rounds, "num_accepted_tokens": self.num_accepted,
            "num_draft_tokens": self.draft_tokens,
            "acceptance_rate": self.num_accepted / self.draft_tokens if self.draft_tokens else 0.0,
            "mean_acceptance_length": 1 + self.num_accepted / self.rounds if self.rounds else 1.0,
            "per_position": [a / self.rounds if self.rounds else 0.0 for a in self.accepted_per_pos],
            "accepted_per_pos": list(self.accepted_per_pos),
            "per_class": {c: rate(self.accepted[c], self.rejected[c]) for c in classes},
            "class_counts": {c: {"accepted": self.accepted[c], "rejected": self.rejected[c]} for c in classes},
            "per_field": {f: rate(self.field_accepted[f], self.field_rejected[f]) for f in fields},
            "field_counts": {f: {"accepted": self.field_accepted[f], "rejected": self.field_rejected[f]}
                             for f in fields},
            "rejections": rejected,
            "schema_rejection_share": schema / rejected if rejected else None,
            "rejection_share_by_class": {c: self.rejected[c] / rejected for c in classes} if rejected else {},
            "class_by_position": {c: [rate(self.cell_accepted[(c, p)], self.cell_rejected[(c, p)])
                                      for p in range(len(self.accepted_per_pos))] for c in classes},
        }
