"""The recommendation on synthetic result tables, including the study's high-load regression of γ = 5."""

from __future__ import annotations

import pytest

from specops.bench.recommend import recommend, schedule


def row(gamma, conc, tput, goodput=None, speedup=None, temperature=0.0, lo=None, hi=None):
    return {"gamma": gamma, "concurrency": conc, "temperature": temperature, "output_tokens_per_s": tput,
            "goodput_rps": tput / 100 if goodput is None else goodput,
            "speedup_throughput": None if speedup is None else {"value": speedup, "ci95_low": lo, "ci95_high": hi}}


def table(tputs: dict[int, dict[int, float]], temperature=0.0) -> list[dict]:
    """{concurrency: {γ: tokens/s}} → rows with speedups against γ = 0."""
    return [row(g, c, t, speedup=t / by_g[0], temperature=temperature)
            for c, by_g in tputs.items() for g, t in by_g.items()]


# Shaped like the study: γ = 5 wins at low load, γ = 3 in the middle, γ = 5 regresses at high load.
STUDY = {1: {0: 100, 1: 115, 3: 140, 5: 150}, 4: {0: 350, 1: 390, 3: 450, 5: 440},
         16: {0: 1000, 1: 1100, 3: 1250, 5: 1150}, 32: {0: 1600, 1: 1700, 3: 1900, 5: 1500},
         64: {0: 2400, 1: 2450, 3: 2600, 5: 2000}}


def vllm_accepts(ranges: list[list[int]]) -> bool:
    """vLLM's validation of num_speculative_tokens_per_batch_size: positive inclusive ranges, sorted,
    non-overlapping, starting at 1, K ≥ 0."""
    prev = 0
    for start, end, k in ranges:
        if not (0 < start <= end) or k < 0 or start <= prev:
            return False
        prev = end
    return ranges[0][0] == 1


def test_best_gamma_per_level_and_the_deployable_schedule():
    rec = recommend(table(STUDY), draft="/models/draft")
    (block,) = rec["by_temperature"]
    assert [(lv["concurrency"], lv["gamma"]) for lv in block["levels"]] == [(1, 5), (4, 3), (16, 3), (32, 3), (64, 3)]
    assert all(lv["chosen_by"] == "goodput" for lv in block["levels"])
    ranges = block["vllm"]["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert ranges == [[1, 1, 5], [2, 64, 3]]  # 4..64 share γ = 3 and merge
    assert vllm_accepts(ranges)
    spec = block["vllm"]["speculative_config"]
    assert (spec["method"], spec["model"], spec["num_speculative_tokens"]) == ("eagle3", "/models/draft", 5)
    assert block["embedded"]["gamma_per_batch_size"] == ranges
    assert '"num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 64, 3]]' in block["vllm"]["cli"]


def test_the_engines_gamma_is_compared_with_the_best_fixed_gamma_and_stays_out_of_the_schedule():
    tputs = {1: {0: 100, 3: 140, "auto": 150, "schedule": 145}, 4: {0: 350, 3: 450, "auto": 400, "schedule": 460}}
    (block,) = recommend(table(tputs))["by_temperature"]
    assert [(lv["concurrency"], lv["gamma"]) for lv in block["levels"]] == [(1, 3), (4, 3)]
    assert block["embedded"]["gamma_per_batch_size"] == [[1, 4, 3]]
    got = {(d["concurrency"], d["drafter"]): (d["gamma"], d["eagle3_gamma"], d["throughput_vs_eagle3"])
           for d in block["drafters"]}
    assert got == {(1, "eagle3 auto"): ("auto", 3, pytest.approx(150 / 140)),
                   (1, "eagle3 schedule"): ("schedule", 3, pytest.approx(145 / 140)),
                   (4, "eagle3 auto"): ("auto", 3, pytest.approx(400 / 450)),
                   (4, "eagle3 schedule"): ("schedule", 3, pytest.approx(460 / 450))}


def test_a_run_of_a_schedule_alone_recommends_nothing_and_compares_with_nothing():
    """The second, short run of a study applies a schedule by itself: no fixed γ to choose from or compare with."""
    (block,) = recommend([row("schedule", 1, 140), row("schedule", 4, 450)])["by_temperature"]
    assert block["levels"] == [] and block["embedded"]["gamma_per_batch_size"] is None
    assert block["vllm"]["speculative_config"] is None and "drafters" not in block


def test_high_load_regression_is_flagged():
    (block,) = recommend(table(STUDY))["by_temperature"]
    flagged = [(r["gamma"], r["concurrency"]) for r in block["regressions"]]
    assert flagged == [(5, 32), (5, 64)]
    assert block["regressions"][1]["speedup"] == pytest.approx(2000 / 2400)


def test_regression_significance_comes_from_the_interval():
    rows = [row(0, 8, 100, speedup=1.0), row(3, 8, 95, speedup=0.95, lo=0.90, hi=0.99),
            row(5, 8, 97, speedup=0.97, lo=0.85, hi=1.10)]
    regs = recommend(rows)["by_temperature"][0]["regressions"]
    assert [(r["gamma"], r["significant"]) for r in regs] == [(3, True), (5, False)]


def test_goodput_outranks_throughput():
    # γ = 5 streams more tokens/s but fewer of its requests finish within the SLO
    rows = [row(0, 4, 300, goodput=2.0), row(3, 4, 380, goodput=3.5), row(5, 4, 420, goodput=3.0)]
    (lv,) = recommend(rows)["by_temperature"][0]["levels"]
    assert (lv["gamma"], lv["best_gamma_goodput"], lv["best_gamma_throughput"]) == (3, 3, 5)


def test_when_no_configuration_meets_the_slo_throughput_decides_and_it_is_said():
    rows = [row(0, 64, 2400, goodput=0.0), row(3, 64, 2600, goodput=0.0)]
    block = recommend(rows)["by_temperature"][0]
    assert (block["levels"][0]["gamma"], block["levels"][0]["chosen_by"]) == (3, "throughput")
    assert "concurrency 64" in block["notes"][0]


def test_no_gain_anywhere_recommends_no_speculation():
    rows = table({1: {0: 100, 3: 90}, 8: {0: 500, 3: 400}})
    block = recommend(rows)["by_temperature"][0]
    assert block["vllm"]["speculative_config"] is None
    assert block["embedded"]["gamma_per_batch_size"] == [[1, 8, 0]]


def test_each_temperature_gets_its_own_recommendation():
    rows = table({1: {0: 100, 3: 150}}, 0.0) + table({1: {0: 100, 3: 80}}, 0.7)
    blocks = recommend(rows)["by_temperature"]
    assert [(b["temperature"], b["levels"][0]["gamma"]) for b in blocks] == [(0.0, 3), (0.7, 0)]


@pytest.mark.parametrize("levels, expected", [
    ([(1, 3)], [[1, 1, 3]]),
    ([(64, 0), (1, 5), (16, 5)], [[1, 16, 5], [17, 64, 0]]),
    ([(1, 5), (4, 3), (16, 5)], [[1, 1, 5], [2, 4, 3], [5, 16, 5]]),
])
def test_schedule_covers_one_to_max_and_merges_neighbours(levels, expected):
    assert schedule(levels) == expected
    assert vllm_accepts(expected)
