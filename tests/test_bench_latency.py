"""Serving-metric maths against hand-computed timelines, the percentile method, goodput, and the speedup interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specops.bench.latency import distribution, meets_slo, ratio_ci, summarize, tpot_s
from specops.bench.record import RequestRecord

# Four requests over a 2 s benchmark (seconds):
#   r0: TTFT 0.1, E2E 0.5, 5 tokens in 5 chunks 0.1 s apart      → TPOT (0.5-0.1)/4 = 0.1
#   r1: TTFT 0.3, E2E 1.5, 4 tokens in 4 chunks 0.4 s apart      → TPOT (1.5-0.3)/3 = 0.4
#   r2: TTFT 0.2, E2E 0.2, 1 token                               → TPOT undefined (0 for goodput)
#   r3: failed after 0.05 s
TIMELINE = [
    RequestRecord(0, "a", 0.0, 0.5, True, ttft_s=0.1, itl_s=(0.1, 0.1, 0.1, 0.1), output_tokens=5, prompt_tokens=7,
                  tokens_from="usage"),
    RequestRecord(1, "b", 0.2, 1.5, True, ttft_s=0.3, itl_s=(0.4, 0.4, 0.4), output_tokens=4, prompt_tokens=9,
                  tokens_from="usage"),
    RequestRecord(2, "c", 0.4, 0.2, True, ttft_s=0.2, output_tokens=1, prompt_tokens=4, tokens_from="usage"),
    RequestRecord(3, "d", 0.5, 0.05, False, error="HTTP 500: boom"),
]


def test_tpot_follows_vllm_definition():
    assert [tpot_s(r) for r in TIMELINE] == [pytest.approx(0.1), pytest.approx(0.4), None, None]


def test_summary_of_the_hand_computed_timeline():
    s = summarize(TIMELINE, duration_s=2.0, slo_s={"e2e": 1.0, "tpot": 0.2})
    assert (s["requests"], s["completed"], s["errors"]) == (4, 3, 1)
    assert (s["total_output_tokens"], s["total_input_tokens"]) == (10, 20)
    assert s["requests_per_s"] == pytest.approx(1.5)
    assert s["output_tokens_per_s"] == pytest.approx(5.0)
    assert s["total_tokens_per_s"] == pytest.approx(15.0)
    # r0 meets both; r1 misses e2e; r2 meets (TPOT counts as 0); r3 failed → 2 good of 4
    assert s["goodput_rps"] == pytest.approx(1.0)
    assert s["slo_attainment"] == pytest.approx(0.5)
    # in flight (Little's law): every request's time, failed ones too, over the duration: (0.5+1.5+0.2+0.05) / 2
    assert s["in_flight_mean"] == pytest.approx(1.125)
    # TTFT [100, 300, 200] ms: linear percentiles on the sorted values, rank p/100·(n-1)
    assert s["ttft_ms"] == pytest.approx({"mean": 200, "p50": 200, "p90": 280, "p95": 290, "p99": 298})
    # TPOT [100, 400] ms (the one-token request has none)
    assert s["tpot_ms"] == pytest.approx({"mean": 250, "p50": 250, "p90": 370, "p95": 385, "p99": 397})
    # ITL: four gaps of 100 ms and three of 400 ms; p90 rank 5.4 lies among the 400s
    assert s["itl_ms"] == pytest.approx({"mean": 1600 / 7, "p50": 100, "p90": 400, "p95": 400, "p99": 400})
    assert s["e2el_ms"] == pytest.approx({"mean": 2200 / 3, "p50": 500, "p90": 1300, "p95": 1400, "p99": 1480})


@pytest.mark.parametrize("slo, good", [
    ({}, 3),                              # no SLO: every completed request is good
    ({"ttft": 0.15}, 1),                  # only r0 starts within 150 ms
    ({"e2e": 0.5}, 2),                    # the limit itself counts as met (r0 at exactly 0.5 s, r2)
    ({"tpot": 0.05}, 1),                  # only the one-token request (TPOT 0)
    ({"ttft": 1.0, "tpot": 1.0, "e2e": 0.1}, 0),
])
def test_goodput_counts_requests_meeting_every_slo(slo, good):
    assert sum(meets_slo(r, slo) for r in TIMELINE) == good
    assert summarize(TIMELINE, 2.0, slo)["goodput_rps"] == pytest.approx(good / 2.0)


def test_failed_request_never_meets_an_slo():
    assert not meets_slo(TIMELINE[3], {})


def test_empty_inputs_give_no_distribution():
    assert distribution([]) is None
    s = summarize([], 0.0, {"e2e": 1.0})
    assert (s["requests_per_s"], s["slo_attainment"], s["ttft_ms"]) == (0.0, 0.0, None)


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=40))
@settings(max_examples=50, deadline=None)
def test_percentiles_are_numpy_linear(values):
    d = distribution(values)
    ms = np.asarray(values) * 1000
    for p in (50, 90, 95, 99):
        assert d[f"p{p}"] == pytest.approx(float(np.quantile(ms, p / 100, method="linear")))
    assert min(ms) - 1e-6 <= d["p50"] <= d["p90"] <= d["p95"] <= d["p99"] <= max(ms) + 1e-6


def test_ratio_ci_hand_computed():
    # means 3 and 1.5 → ratio 2; relative variances 2/(2·9) = 0.5/(2·2.25) = 1/9 each; se = √(2/9);
    # Welch–Satterthwaite df = (2/9)² / ((1/9)²/1 + (1/9)²/1) = 2; t(0.975, 2) = 4.302653
    ratio, lo, hi = ratio_ci([2.0, 4.0], [1.0, 2.0])
    half = 4.302653 * math.sqrt(2 / 9)
    assert ratio == pytest.approx(2.0)
    assert (lo, hi) == (pytest.approx(2 * math.exp(-half), rel=1e-6), pytest.approx(2 * math.exp(half), rel=1e-6))


def test_ratio_ci_needs_two_repeats_each():
    assert ratio_ci([3.0], [1.5]) == (pytest.approx(2.0), None, None)
    assert ratio_ci([3.0, 3.0], [1.5, 1.5]) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0))
    assert ratio_ci([], [1.0]) == (None, None, None)


@given(st.lists(st.floats(1, 1000), min_size=2, max_size=8), st.lists(st.floats(1, 1000), min_size=2, max_size=8))
@settings(max_examples=50, deadline=None)
def test_ratio_ci_brackets_the_ratio_symmetrically_in_log_space(num, den):
    ratio, lo, hi = ratio_ci(num, den)
    assert lo <= ratio <= hi
    assert lo * hi == pytest.approx(ratio**2, rel=1e-9)


def test_ratio_ci_covers_the_true_ratio_about_95_percent_of_the_time():
    # Throughputs with 5 % multiplicative noise, 5 repeats each side, true speedup 1.3, seeded.
    rng = np.random.default_rng(0)
    hits, trials = 0, 2000
    for _ in range(trials):
        base = 100 * np.exp(rng.normal(0, 0.05, 5))
        spec = 130 * np.exp(rng.normal(0, 0.05, 5))
        _, lo, hi = ratio_ci(spec, base)
        hits += lo <= 1.3 <= hi
    assert 0.93 <= hits / trials <= 0.97
