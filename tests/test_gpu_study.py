"""The GPU study's parts on the CPU: the prediction formula, the step-cost measurement on the serving engine, and
``benchmarks/gpu_study.py --tiny`` end to end (the scaled recipe at a tiny size, the same code path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specops.engine.engine import Engine
from specops.engine.gamma import measure_parts, measure_prefill, predicted_serving_speedup, predicted_speedup
from specops.engine.sampling import SamplingParams
from specops.fixtures.recipe import FULL, STUDY

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "commerce-tiny"


def test_predicted_speedup_by_hand():
    # E = 3 tokens a round; γ = 3 drafts at 5 % of a step each, verification 1.1 steps: 3 / 1.25
    assert predicted_speedup(3.0, 3, 0.05, 1.1) == pytest.approx(2.4)
    # nothing accepted (E = 1) still pays for the drafts and the wider verify: a slowdown
    assert predicted_speedup(1.0, 5, 0.1, 1.5) == pytest.approx(0.5)
    # γ = 1, E = 1.8, c = 0.2, v = 1.0: 1.8 / 1.2
    assert predicted_speedup(1.8, 1, 0.2, 1.0) == pytest.approx(1.5)


def test_predicted_serving_speedup_by_hand():
    # no prefill: E/(γc + v) whatever the answer length and batch
    assert predicted_serving_speedup(3.0, 3, 0.05, 1.1, 0.0, 100, 64) == pytest.approx(2.4)
    # batch 10, answers of 100 tokens, a prefill of 5 plain steps: plain 5 + 100/10 = 15 steps a request;
    # speculative 5 + (100/3 rounds of 1.25 steps)/10 = 5 + 4.1667; 15 / 9.1667
    assert predicted_serving_speedup(3.0, 3, 0.05, 1.1, 5.0, 100, 10) == pytest.approx(15 / (5 + 125 / 30))
    # the prefill weighs more the larger the batch: it is paid alone, the rounds are shared
    assert predicted_serving_speedup(3.0, 3, 0.05, 1.1, 0.5, 100, 64) < predicted_serving_speedup(
        3.0, 3, 0.05, 1.1, 0.5, 100, 1) < 2.4


def test_the_study_recipe_is_the_fixture_recipe_scaled_up():
    assert STUDY.hidden_size * STUDY.num_layers > 10 * FULL.hidden_size * FULL.num_layers
    assert STUDY.head_dim >= 64 and STUDY.num_layers >= 8  # EAGLE-3's three taps stay distinct
    per_layer = (2 * STUDY.num_heads + 2 * STUDY.num_kv_heads) * STUDY.head_dim * STUDY.hidden_size \
        + 3 * STUDY.hidden_size * STUDY.intermediate_size
    embeddings = 2 * STUDY.vocab_size * STUDY.hidden_size
    assert per_layer * STUDY.num_layers + embeddings >= 150e6


def gpu_study():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_study", REPO / "benchmarks" / "gpu_study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    return study


def test_part_of_the_grid_sets_the_concurrencies_and_the_batch_sizes_costed(monkeypatch):
    study = gpu_study()
    monkeypatch.setattr(sys, "argv", ["gpu_study.py", "--concurrency", "64,32,64"])
    sweep = study.settings(study.parse())[2]
    assert sweep["concurrency"] == sweep["parts_batches"] == [32, 64]
    assert sweep["gammas"] == [0, 1, 3, 5] and sweep["waves"] == 16
    monkeypatch.setattr(sys, "argv", ["gpu_study.py", "--concurrency", "0,4"])
    with pytest.raises(SystemExit):
        study.parse()


def test_the_cached_prefill_is_timed_at_the_positions_the_prefix_cache_serves():
    study = gpu_study()
    system = list(range(100, 120))  # 20 shared tokens: from the third prompt on, 19 positions come from the cache
    assert study.cached_positions([system + [i, 7, 8] for i in range(4)]) == round(2 * 19 / 4)
    assert study.cached_positions([[i] * 30 for i in range(4)]) == 0  # nothing shared


def test_a_row_is_predicted_from_the_step_costs_of_its_own_temperature_and_next_batch_size():
    study = gpu_study()
    greedy = [{"temperature": 0.0, "batch": b, "c": 0.05, "v": {"3": 1.1}} for b in (1, 8)]
    sampled = [{"temperature": 0.7, "batch": b, "c": 0.1, "v": {"3": 1.5 if b == 8 else 9.0}} for b in (1, 8)]

    def row(t):
        return {"gamma": 3, "concurrency": 4, "temperature": t, "acceptance": {"mean_acceptance_length": 3.0}}

    assert study.predicted(row(0.0), greedy + sampled) == pytest.approx(3 / (3 * 0.05 + 1.1))
    assert study.predicted(row(0.7), greedy + sampled) == pytest.approx(3 / (3 * 0.1 + 1.5))
    assert study.predicted(row(0.7), greedy) == pytest.approx(3 / (3 * 0.05 + 1.1))  # costs measured greedy only
    assert study.predicted({**row(0.0), "gamma": 0}, greedy) is None
    assert study.predicted(row(0.0), []) is None  # no step costs measured (a run cut short before them)
    assert study.predicted_with_prefill(row(0.0), greedy) is None  # costs from before the prefill was measured
    with_prefill = [{**p, "prefill": 2.0} for p in greedy]
    served = {**row(0.0), "requests_per_s": 10.0, "output_tokens_per_s": 500.0}  # 50 tokens an answer
    assert study.predicted_with_prefill(served, with_prefill) == pytest.approx(
        (2 + 50 / 4) / (2 + 50 * (3 * 0.05 + 1.1) / (3 * 4)))


def test_the_schedule_is_set_against_the_best_fixed_gamma_and_a_remeasurement_is_told_apart(tmp_path):
    def point(conc, gamma, goodput):
        return {"temperature": 0.0, "concurrency": conc, "gamma": gamma, "goodput_rps": goodput,
                "output_tokens_per_s": 100 * goodput}

    grid = [point(1, 3, 9.0), point(1, 5, 10.0), point(32, 3, 50.0), point(32, 5, 40.0), point(64, 5, 60.0),
            point(64, 3, 59.0)]
    ranges = [[1, 16, 5], [17, 32, 3], [33, 64, 5]]
    run = tmp_path / "schedule-t0"
    run.mkdir()
    measured = [point(1, "schedule", 9.5), point(32, "schedule", 52.0), point(64, "schedule", 63.0)]
    (run / "results.json").write_text(json.dumps({"configurations": measured}))
    rows = gpu_study().schedule_table(grid, {"0.0": {"schedule": ranges, "run": run.name}}, tmp_path)
    got = {r["concurrency"]: (r["best_fixed_gamma"], r["goodput_vs_best_fixed"], r["same_configuration"])
           for r in rows}
    # at 1 the schedule is γ = 5, the best fixed γ: one configuration measured twice; at 32 and 64 it switches γ
    assert got == {1: (5, pytest.approx(0.95), True), 32: (3, pytest.approx(52 / 50), False),
                   64: (5, pytest.approx(1.05), False)}
    assert {r["peer"] for r in rows} == {"grid"} and all(r["throughput_ratio_ci95"] == [None, None] for r in rows)


def test_the_schedule_is_set_against_its_peers_measured_in_the_same_run(tmp_path):
    """Where the schedule's sweep measured the best fixed γ again, the ratio is against that figure (not the grid's,
    the best of several noisy ones), with a CI from both sides' repeats."""
    def point(conc, gamma, repeats):
        tps = sum(repeats) / len(repeats)
        return {"temperature": 0.7, "concurrency": conc, "gamma": gamma, "goodput_rps": tps / 100,
                "output_tokens_per_s": tps, "output_tokens_per_s_repeats": repeats}

    grid = [point(1, 3, [900.0]), point(1, 5, [1000.0]), point(64, 3, [6000.0]), point(64, 5, [5800.0])]
    run = tmp_path / "schedule-t0.7"
    run.mkdir()
    measured = [point(1, "schedule", [960.0, 980.0]), point(1, 5, [940.0, 1000.0]),
                point(64, "schedule", [5900.0, 5700.0]), point(64, 3, [5800.0, 5900.0])]
    (run / "results.json").write_text(json.dumps({"configurations": measured}))
    rows = gpu_study().schedule_table(grid, {"0.7": {"schedule": [[1, 16, 5], [17, 64, 3]], "run": run.name}},
                                      tmp_path)
    by = {r["concurrency"]: r for r in rows}
    assert by[1]["best_fixed_gamma"] == 5 and by[1]["peer"] == "same run" and by[1]["same_configuration"]
    assert by[1]["goodput_vs_best_fixed"] == pytest.approx(970 / 970)
    assert by[64]["best_fixed_gamma"] == 3 and not by[64]["same_configuration"]
    assert by[64]["goodput_vs_best_fixed"] == pytest.approx(5800 / 5850)  # not 5800 / 6000, the grid's
    on_one = gpu_study().schedule_table(grid, {"0.7": {"schedule": [[1, 16, 5], [17, 64, 3]], "run": run.name,
                                                       "one_server": True}}, tmp_path)
    assert {r["peer"] for r in on_one} == {"same server"}
    lo, hi = by[64]["throughput_ratio_ci95"]
    assert lo < 5800 / 5850 < hi and lo > 0.5 and hi < 2


def test_schedules_that_switch_gamma_are_measured_first():
    def block(t, ranges):
        return {"temperature": t, "embedded": {"gamma_per_batch_size": ranges}}

    blocks = [block(0.0, [[1, 64, 5]]), block(0.7, [[1, 4, 5], [5, 64, 3]]), block(1.0, [[1, 64, 0]])]
    assert [b["temperature"] for b in gpu_study().switching_first(blocks)] == [0.7, 0.0, 1.0]


def test_a_fixed_gamma_measured_again_gives_the_spread_between_two_servers(tmp_path):
    def point(conc, gamma, tps):
        return {"temperature": 0.0, "concurrency": conc, "gamma": gamma, "output_tokens_per_s": tps}

    grid = [point(1, 3, 900.0), point(1, 5, 1000.0), point(64, 5, 5000.0)]
    run = tmp_path / "schedule-t0"
    run.mkdir()
    again = [point(1, "schedule", 990.0), point(1, 5, 1030.0), point(64, 5, 4800.0), point(16, 5, 3000.0)]
    (run / "results.json").write_text(json.dumps({"configurations": again}))
    runs = {"0.0": {"schedule": [[1, 64, 5]], "run": run.name}, "0.7": {"note": "no speculation recommended"}}
    rows = gpu_study().server_spread(grid, runs, tmp_path)
    # the schedule is no fixed γ, and concurrency 16 is not in the grid: neither is a pair
    assert [(r["concurrency"], r["gamma"], r["ratio"]) for r in rows] == [(1, 5, pytest.approx(1.03)),
                                                                          (64, 5, pytest.approx(0.96))]


def test_step_costs_come_from_the_serving_engine_and_leave_it_serving():
    prompts = [[1, 5, 9, 14, 20], [1, 30, 31]]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    plain = Engine.load(FIXTURES / "target-merged", max_batch=4, max_seq_len=256)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    engine = Engine.load(FIXTURES / "target-merged", FIXTURES / "draft-domain", gamma=3, max_batch=4, max_seq_len=256)
    parts = measure_parts(engine.runner, [1, 3], [1, 4], context=64)
    assert [p["batch"] for p in parts] == [1, 4]
    for p in parts:
        assert p["target_ms"] > 0 and p["draft_ms"] >= 0 and p["c"] == pytest.approx(p["draft_ms"] / p["target_ms"])
        assert set(p["v"]) == {1, 3}
        for g in (1, 3):
            assert p["v"][g] == pytest.approx(p["verify_ms"][g] / p["target_ms"])
            assert p["round_ms"][g] >= p["verify_ms"][g] * 0.5  # a round verifies, then drafts
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected  # its slots were free again
    sampled = measure_parts(engine.runner, [3], [4], context=64, temperature=0.7)
    assert sampled[0]["temperature"] == 0.7 and sampled[0]["v"][3] > 0 and sampled[0]["c"] >= 0
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected  # sampling state overwritten again
    assert measure_prefill(engine.runner, 40) > 0 and measure_prefill(engine.runner, 40, temperature=0.7) > 0
    assert measure_prefill(engine.runner, 40, cached=20) > 0 and measure_prefill(engine.runner, 40, 0.7, cached=30) > 0
    with pytest.raises(ValueError):
        measure_prefill(engine.runner, 40, cached=40)
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected  # the prefilled slot is reused


@pytest.mark.timeout(900)
def test_the_study_script_runs_every_stage_at_a_tiny_size(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_study.py"), "--tiny", "--device", "cpu",
           "--work", str(work), "--out", str(out), "--budget-s", "800"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=880)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((out / "study.json").read_text())
    assert doc["status"] == {"grid": "complete", "schedule": "complete"}
    assert doc["host"]["cpus"] >= 1 and doc["host"]["cpu"]
    m = doc["models"]
    assert m["parameters"] > 0 and set(m["target"]) >= {"valid_rate", "field_accuracy"}
    assert (work / "models" / "target-merged" / "model.safetensors").is_file()
    assert doc["draft"]["acceptance"]["after"]["gamma"] == 3
    assert [(p["temperature"], p["batch"]) for p in doc["costs"]] == [(0.0, 1), (0.0, 4), (0.7, 1), (0.7, 4)]
    assert all(p["prompt_tokens"] > p["cached_tokens"] > 0
               and p["prefill"] == pytest.approx(p["prefill_ms"] / p["target_ms"]) for p in doc["costs"])
    points = {(r["temperature"], r["concurrency"], r["gamma"]) for r in doc["grid"]}
    assert points == {(t, c, g) for t in (0.0, 0.7) for c in (1, 4) for g in (0, 3)}
    for r in doc["grid"]:
        assert r["output_tokens_per_s"] > 0 and r["e2el_p99"] >= r["e2el_p50"] > 0
        assert 0 < r["in_flight_mean"] <= r["concurrency"]
        if r["gamma"] == 3:
            assert r["predicted_speedup"] > 0 and r["speedup_ci95"][0] is not None  # two repeats: a CI
            pred = r["predicted_speedup"]  # a prefill, the same for every γ, pulls the prediction towards 1
            assert min(pred, 1.0) < r["predicted_with_prefill"] < max(pred, 1.0)
    for name in ("results.json", "results.csv", "recommendation.json"):
        assert (out / name).is_file()
    for t, info in doc["schedule_runs"].items():  # each schedule set against its peers, measured beside it
        rows = [r for r in doc["schedule"] if r["temperature"] == float(t)]
        assert ("peers" in info) == bool(rows)
        if rows:
            assert all(r["peer"] == ("same server" if info["one_server"] else "same run") for r in rows)
            assert info["one_server"] == (0 not in info["peers"])  # plain decoding needs a server of its own
    assert "speedup [95% CI]" in run.stdout and "meas/pred" in run.stdout
    # a second call finds every stage done and measures nothing again
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "training" not in again.stdout and "already measured" in again.stderr


def test_a_build_stopped_in_its_lora_stage_goes_on_from_its_base(tmp_path):
    """The models stage may outlast a time-limited call: the finished base is kept and not trained again."""
    from dataclasses import replace

    from specops.fixtures.recipe import QUICK, build_models

    recipe = replace(STUDY, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16,
                     **{k: getattr(QUICK, k) for k in ("corpus_docs", "tokenizer_docs", "pretrain_steps",
                                                       "pretrain_batch", "train_examples", "lora_steps",
                                                       "lora_batch", "eval_examples", "max_new_tokens")})

    def stop_in_lora(stage, step, total, loss):
        if stage == "lora":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_models(tmp_path, recipe, 0, stop_in_lora)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # whole, and nothing half-written beside it
    base = (tmp_path / "base" / "model.safetensors").read_bytes()
    stages = []
    summary = build_models(tmp_path, recipe, 0, lambda stage, *_: stages.append(stage))
    assert "pretrain" not in stages and "lora" in stages
    assert (tmp_path / "base" / "model.safetensors").read_bytes() == base
    assert (tmp_path / "target-merged" / "model.safetensors").is_file() and summary["parameters"] > 0
