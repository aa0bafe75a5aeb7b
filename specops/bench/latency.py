"""Serving-metric maths as pure functions over request records, following ``vllm bench serve``.

- TTFT = first text chunk − send; E2EL = end of stream − send; ITL = gaps between consecutive text chunks.
- TPOT = (E2EL − TTFT) / (output_tokens − 1), defined for requests with more than one output token; in goodput a
  one-token request counts with TPOT 0 (vLLM's convention).
- Percentiles: ``numpy.percentile`` with the default ``linear`` method, as vLLM.
- Throughput: completed requests and output tokens of completed requests over the benchmark duration.
- Goodput (DistServe): requests per second that completed and met every SLO (each metric ≤ its limit);
  SLO attainment is the same count over all requests sent, failed ones included.
- Speedup of γ over γ = 0: ratio of means over repeats, 95 % interval by the delta method on the log ratio
  (se² = s₁²/(n₁·m₁²) + s₀²/(n₀·m₀²), Student t with Welch–Satterthwaite degrees of freedom), which keeps the
  interval positive and asymmetric as a ratio's should be.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import numpy as np
from scipy import stats

from specops.bench.record import RequestRecord

PERCENTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "numpy.percentile, method='linear' (as vllm bench serve)"
SPEEDUP_CI_METHOD = ("ratio of means over repeats; 95 % CI by the delta method on log(ratio) with Student t and "
                     "Welch-Satterthwaite degrees of freedom; null with fewer than 2 repeats on either side")
SLO_METRICS = ("ttft", "tpot", "e2e")


def tpot_s(r: RequestRecord) -> Optional[float]:
    """Time per output token after the first; None when it is undefined (failed, or at most one token)."""
    if not r.ok or r.output_tokens <= 1 or r.ttft_s is None:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def distribution(values_s: Iterable[float]) -> Optional[dict[str, float]]:
    """Mean and p50/p90/p95/p99 in milliseconds; None for no values."""
    x = np.asarray(list(values_s), dtype=float) * 1000.0
    if x.size == 0:
        return None
    out = {"mean": float(x.mean())}
    out.update({f"p{p}": float(np.percentile(x, p, method="linear")) for p in PERCENTILES})
    return out


def slo_values(r: RequestRecord) -> dict[str, float]:
    """The per-request values the SLOs are checked against (seconds)."""
    return {"ttft": r.ttft_s, "tpot": tpot_s(r) or 0.0, "e2e": r.e2e_s}


def meets_slo(r: RequestRecord, slo_s: dict[str, float]) -> bool:
    """Completed and every SLO'd metric at or under its limit."""
    if not r.ok or r.ttft_s is None:
        return False
    v = slo_values(r)
    return all(v[k] <= limit for k, limit in slo_s.items())


def summarize(records: Sequence[RequestRecord], duration_s: float, slo_s: dict[str, float]) -> dict:
    """Every serving metric of one timed run of requests. ``in_flight_mean`` is the concurrency the load generator
    actually kept (Little's law: requests' time in flight over the run's duration); below the configured one, the
    client, not the server, set part of the pace."""
    done = [r for r in records if r.ok]
    good = sum(meets_slo(r, slo_s) for r in records)
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens or 0 for r in done)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    return {
        "requests": len(records),
        "completed": len(done),
        "errors": len(records) - len(done),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "requests_per_s": per_s(len(done)),
        "output_tokens_per_s": per_s(out_tokens),
        "total_tokens_per_s": per_s(in_tokens + out_tokens),
        "goodput_rps": per_s(good),
        "slo_attainment": good / len(records) if records else 0.0,
        "in_flight_mean": per_s(sum(r.e2e_s for r in records)),
        "ttft_ms": distribution(r.ttft_s for r in done if r.ttft_s is not None),
        "tpot_ms": distribution(t for t in map(tpot_s, done) if t is not None),
        "itl_ms": distribution(g for r in done for g in r.itl_s),
        "e2el_ms": distribution(r.e2e_s for r in done),
    }


def ratio_ci(num: Sequence[float], den: Sequence[float], level: float = 0.95
             ) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(mean(num)/mean(den), low, high); the bounds are None with fewer than two samples on either side."""
    x, y = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if x.size == 0 or y.size == 0 or y.mean() == 0:
        return None, None, None
    ratio = float(x.mean() / y.mean())
    if x.size < 2 or y.size < 2 or ratio <= 0:
        return ratio, None, None
    a = x.var(ddof=1) / (x.size * x.mean() ** 2)
    b = y.var(ddof=1) / (y.size * y.mean() ** 2)
    if a + b == 0:
        return ratio, ratio, ratio
    df = (a + b) ** 2 / (a**2 / (x.size - 1) + b**2 / (y.size - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(a + b)
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)
