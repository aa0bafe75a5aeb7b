"""The statistics behind the quality verdicts: bootstrap intervals, the exact sign test, two-sample tests.

Bootstrap intervals are percentile intervals over ``n`` resamples drawn with a seeded generator, so a report
reproduces exactly; paired intervals resample items, keeping each item's two answers together.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np
from scipy import stats

RESAMPLES = 2000


def bootstrap_mean(values: Sequence[float], seed: int = 0, n: int = RESAMPLES) -> dict:
    """Mean with a 95 % percentile bootstrap interval."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return {"value": None, "ci95_low": None, "ci95_high": None}
    means = np.random.default_rng(seed).choice(x, size=(n, x.size), replace=True).mean(axis=1)
    return {"value": float(x.mean()), "ci95_low": float(np.percentile(means, 2.5)),
            "ci95_high": float(np.percentile(means, 97.5))}


def paired_difference(baseline: Sequence[float], candidate: Sequence[float], seed: int = 0) -> dict:
    """Mean of candidate − baseline over paired items, with a 95 % paired bootstrap interval."""
    a, b = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    if a.shape != b.shape:
        raise ValueError("paired samples must have the same length")
    return bootstrap_mean(b - a, seed)


def sign_test(wins: int, losses: int) -> float | None:
    """Exact two-sided binomial test of wins vs losses (ties left out) against p = 1/2."""
    if wins + losses == 0:
        return None
    return float(stats.binomtest(wins, wins + losses, 0.5).pvalue)


def categorical_test(a: Sequence, b: Sequence) -> dict:
    """Do two samples of a categorical value (or of list items) share a distribution? Fisher's exact test for a
    2 × 2 table, else the chi-square test of independence."""
    cats = sorted(set(a) | set(b), key=repr)
    if len(cats) < 2:
        return {"test": "identical support (one category)", "p_value": 1.0}
    ca, cb = Counter(a), Counter(b)
    table = np.array([[ca[c] for c in cats], [cb[c] for c in cats]])
    if table.shape == (2, 2):
        return {"test": "Fisher exact", "p_value": float(stats.fisher_exact(table).pvalue)}
    return {"test": "chi-square", "p_value": float(stats.chi2_contingency(table).pvalue)}


def numeric_test(a: Sequence[float], b: Sequence[float]) -> dict:
    """Mann-Whitney U (two-sided) on two samples of a number; None values left out."""
    x, y = [v for v in a if v is not None], [v for v in b if v is not None]
    if not x or not y:
        return {"test": "Mann-Whitney U", "p_value": None}
    if set(x) == set(y) and len(set(x)) == 1:
        return {"test": "Mann-Whitney U", "p_value": 1.0}
    return {"test": "Mann-Whitney U", "p_value": float(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)}
