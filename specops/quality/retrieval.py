"""What the shopper is shown: each answer's parameters run as a catalog search, both sides compared at top k."""

from __future__ import annotations

from pathlib import Path

from specops.quality.outputs import Answer
from specops.task.catalog import open_catalog, search
from specops.task.scoring import parse


def compare(baseline: dict[str, Answer], candidate: dict[str, Answer], catalog: Path, k: int = 10) -> dict:
    """overlap@k per query = |top-k(A) ∩ top-k(B)| / max(|top-k(A)|, |top-k(B)|), 1 when both are empty; unparseable
    or invalid parameters search for nothing."""
    ids = sorted(baseline.keys() & candidate.keys())
    conn = open_catalog(catalog)
    try:
        overlaps, identical, empty_a, empty_b = [], 0, 0, 0
        for i in ids:
            a = [r["id"] for r in search(conn, parse(baseline[i].text), k)]
            b = [r["id"] for r in search(conn, parse(candidate[i].text), k)]
            overlaps.append(len(set(a) & set(b)) / max(len(a), len(b)) if a or b else 1.0)
            identical += a == b
            empty_a += not a
            empty_b += not b
    finally:
        conn.close()
    n = len(ids)
    return {"k": k, "queries": n, "overlap_at_k": sum(overlaps) / n if n else None,
            "identical_top_k_share": identical / n if n else None,
            "baseline_empty_share": empty_a / n if n else None, "candidate_empty_share": empty_b / n if n else None}
