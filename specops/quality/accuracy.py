"""Task accuracy of both sides against gold, side by side, and the candidate's difference with paired bootstrap
95 % intervals (items resampled together, so the interval reflects the answers that changed)."""

from __future__ import annotations

from specops.quality.outputs import Answer
from specops.quality.stats import paired_difference
from specops.task.schema import FIELDS
from specops.task.scoring import score, score_one


def compare(baseline: dict[str, Answer], candidate: dict[str, Answer], gold: dict[str, dict], seed: int = 0) -> dict:
    ids = sorted(baseline.keys() & candidate.keys() & gold.keys())
    if not ids:
        return {}
    a = [score_one(baseline[i].text, gold[i]) for i in ids]
    b = [score_one(candidate[i].text, gold[i]) for i in ids]
    field_acc = lambda s: sum(s.field_correct.values()) / len(FIELDS)  # noqa: E731
    return {
        "items": len(ids),
        "baseline": score([baseline[i].text for i in ids], [gold[i] for i in ids]).to_dict(),
        "candidate": score([candidate[i].text for i in ids], [gold[i] for i in ids]).to_dict(),
        "difference": paired_difference([field_acc(s) for s in a], [field_acc(s) for s in b], seed),
        "exact_match_difference": paired_difference([float(s.exact) for s in a], [float(s.exact) for s in b], seed),
        "valid_difference": paired_difference([float(s.valid) for s in a], [float(s.valid) for s in b], seed),
    }
