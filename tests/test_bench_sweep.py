"""Real sweeps through the embedded server: a SIGKILLed sweep resumes without redoing or losing anything, and a
sweep on the fixture models fills every result field."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_helpers import make_target
from serve_helpers import FIXTURE
from typer.testing import CliRunner

from specops.bench.cli import app
from specops.files import read_json
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaConfig

REPO = Path(__file__).resolve().parents[1]


def save_random_draft(model: Path, out: Path) -> Path:
    return Eagle3Draft.random(LlamaConfig.from_dict(read_json(model / "config.json")), seed=0).save(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 8-layer target with a character tokenizer, a random draft, and raw-text prompts."""
    root = tmp_path_factory.mktemp("tiny")
    make_target(root / "target", bigram=0.3)
    save_random_draft(root / "target", root / "draft")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                               for i, t in enumerate(["red shoes", "a blue kettle", "cheap laptop", "nice hat"])))
    return root


def sweep_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "specops.bench.cli", "sweep", *args]


def rows(db: Path) -> tuple[dict, dict]:
    """{config key: config row} and {(config key, idx): record JSON}, read without disturbing a writer."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        configs = {r[0]: r for r in conn.execute("SELECT * FROM configs")}
        reqs = {(k, i): rec for k, i, rec in conn.execute("SELECT config_key, idx, record FROM requests")}
    finally:
        conn.close()
    return configs, reqs


def committed(db: Path) -> int:
    if not db.is_file():
        return 0
    try:
        return len(rows(db)[0])
    except sqlite3.OperationalError:  # tables not created yet
        return 0


def alive(pid: int, argv: list[str]) -> bool:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return [a.decode() for a in raw.split(b"\0") if a] == argv


@pytest.mark.slow
def test_sigkilled_sweep_resumes_without_redoing_or_losing_anything(tiny, tmp_path):
    run = tmp_path / "run"
    num_prompts = 4
    args = ["--model", str(tiny / "target"), "--draft", str(tiny / "draft"), "--gamma", "0,3",
            "--concurrency", "1,2", "--temperature", "0", "--dataset", str(tiny / "prompts.jsonl"),
            "--num-prompts", str(num_prompts), "--max-tokens", "8", "--warmup", "1", "--out", str(run)]
    db = run / "runs.sqlite"
    proc = subprocess.Popen(sweep_argv(*args), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    server = None
    try:
        deadline = time.monotonic() + 240
        while committed(db) == 0:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no configuration committed"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        state = run / "server.json"
        server = json.loads(state.read_text()) if state.is_file() else None
        before_configs, before_reqs = rows(db)
        assert 1 <= len(before_configs) < 4

        # a resume with different fixed parameters is refused and changes nothing
        refused = CliRunner().invoke(app, ["sweep", *args, "--max-tokens", "9", "--resume"])
        assert refused.exit_code == 2 and "different fixed parameters (max_tokens: 8 in the run, 9 now)" in refused.output

        done = subprocess.run(sweep_argv(*args, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"resuming: {len(before_configs)} of 4 configurations already measured" in done.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        if server and alive(server["pid"], server["argv"]):
            os.killpg(server["pid"], signal.SIGKILL)
            pytest.fail("the server orphaned by the killed sweep was left running")

    after_configs, after_reqs = rows(db)
    assert len(after_configs) == 4
    assert {(c[1], c[2], c[3]) for c in after_configs.values()} == {(g, c, 0.0) for g in (0, 3) for c in (1, 2)}
    for key in after_configs:
        assert sorted(i for k, i in after_reqs if k == key) == list(range(num_prompts))
    assert {k: after_configs[k] for k in before_configs} == before_configs  # nothing finished was redone
    assert {k: after_reqs[k] for k in before_reqs} == before_reqs  # ... or lost
    results = json.loads((run / "results.json").read_text())
    assert len(results["runs"]) == 4 and len(results["configurations"]) == 4


FIXTURE_READY = (FIXTURE / "base" / "config.json").is_file() and (FIXTURE / "lora").is_dir()


@pytest.mark.slow
@pytest.mark.skipif(not FIXTURE_READY, reason=f"fixture not built: {FIXTURE}")
def test_sweep_on_the_fixture_fills_every_field(tmp_path):
    pytest.importorskip("specops.task.synth")
    draft = save_random_draft(FIXTURE / "target-merged", tmp_path / "draft")
    run = tmp_path / "run"
    done = subprocess.run(sweep_argv(
        "--model", str(FIXTURE / "base"), "--lora", str(FIXTURE / "lora"), "--draft", str(draft),
        "--gamma", "0,3", "--concurrency", "1,4", "--temperature", "0", "--synthetic", "8", "--num-prompts", "6",
        "--max-tokens", "24", "--repeats", "2", "--slo", "e2e=60s,ttft=30s", "--gpu-hourly-cost", "2.5", "--gpus", "1",
        "--out", str(run)), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = json.loads((run / "results.json").read_text())
    assert len(results["runs"]) == 8
    grid = {(r["gamma"], r["concurrency"]): r for r in results["configurations"]}
    assert set(grid) == {(0, 1), (0, 4), (3, 1), (3, 4)}
    for (gamma, _), r in grid.items():
        assert r["errors"] == 0 and r["completed"] == 12
        for dist in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            assert set(r[dist]) == {"mean", "p50", "p90", "p95", "p99"}
        assert r["requests_per_s"] > 0 and r["output_tokens_per_s"] > 0 and r["goodput_rps"] > 0
        assert 0 < r["slo_attainment"] <= 1
        assert 0 < r["in_flight_mean"] <= r["concurrency"]
        assert r["usd_per_million_output_tokens"] > 0
        s = r["speedup_throughput"]
        assert s["ci95_low"] <= s["value"] <= s["ci95_high"]
        if gamma == 3:
            acc = r["acceptance"]
            assert acc["num_drafts"] > 0 and acc["num_draft_tokens"] == 3 * acc["num_drafts"]
            assert 0 <= acc["acceptance_rate"] <= 1 and len(acc["per_position_rate"]) == 3
            assert acc["mean_acceptance_length"] == pytest.approx(1 + acc["num_accepted_tokens"] / acc["num_drafts"])
        else:
            assert r["acceptance"] is None
    for run_row in results["runs"]:
        assert run_row["total_output_tokens"] > 0
    rec = json.loads((run / "recommendation.json").read_text())
    (block,) = rec["by_temperature"]
    assert [lv["concurrency"] for lv in block["levels"]] == [1, 4]
    ranges = block["embedded"]["gamma_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 4
    assert (run / "results.csv").read_text().count("\n") == 5
    assert "sweep summary" in done.stdout


@pytest.mark.slow
def test_schema_drafters_are_configurations_of_their_own(tmp_path):
    """eagle3, schema+eagle3 and schema in one sweep under the contract's schema: one server each, every answer
    schema-valid JSON, forced tokens counted as drafts, and the recommendation compares each drafter with eagle3."""
    from jsonschema import Draft202012Validator

    from specops.task.schema import SCHEMA

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    run = tmp_path / "run"
    done = subprocess.run(sweep_argv(
        "--model", str(FIXTURE / "target-merged"), "--draft", str(FIXTURE / "draft-domain"), "--gamma", "0,3",
        "--drafter", "eagle3,schema+eagle3,schema", "--json-schema", str(schema), "--concurrency", "2",
        "--temperature", "0", "--synthetic", "6", "--num-prompts", "4", "--max-tokens", "200", "--warmup", "1",
        "--slo", "e2e=60s", "--out", str(run)), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = json.loads((run / "results.json").read_text())
    grid = {(r["drafter"], r["gamma"]): r for r in results["configurations"]}
    assert set(grid) == {("eagle3", 0), ("eagle3", 3), ("schema+eagle3", 3), ("schema", 0)}
    assert results["fixed"]["json_schema"]["sha256"]
    validator = Draft202012Validator(SCHEMA)
    with sqlite3.connect(run / "runs.sqlite") as conn:
        texts = [json.loads(r)["text"] for (r,) in conn.execute("SELECT record FROM requests")]
    assert len(texts) == 16 and all(not list(validator.iter_errors(json.loads(t))) for t in texts)
    assert grid[("eagle3", 0)]["acceptance"] is None
    eagle, both, forced = (grid[k]["acceptance"] for k in (("eagle3", 3), ("schema+eagle3", 3), ("schema", 0)))
    assert eagle["num_draft_tokens"] == 3 * eagle["num_drafts"]
    assert both["num_draft_tokens"] > 3 * both["num_drafts"] and forced["num_drafts"] > 0
    assert forced["acceptance_rate"] > 0.8
    for r in grid.values():
        assert r["errors"] == 0 and r["speedup_throughput"] is not None
    (block,) = json.loads((run / "recommendation.json").read_text())["by_temperature"]
    assert {d["drafter"] for d in block["drafters"]} == {"schema", "schema+eagle3"}
    assert all(lv["gamma"] in (0, 3) for lv in block["levels"])  # the γ schedule is chosen among eagle3 rows
    assert "drafter" in done.stdout


@pytest.mark.slow
def test_auto_gamma_is_a_configuration_of_its_own_and_resumes(tiny, tmp_path):
    run = tmp_path / "run"
    argv = sweep_argv("--model", str(tiny / "target"), "--draft", str(tiny / "draft"), "--gamma", "0,2,auto",
                      "--concurrency", "1,3", "--temperature", "0", "--dataset", str(tiny / "prompts.jsonl"),
                      "--num-prompts", "4", "--max-tokens", "12", "--warmup", "1", "--slo", "e2e=60s", "--out", str(run))
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = json.loads((run / "results.json").read_text())
    grid = {(r["gamma"], r["concurrency"]): r for r in results["configurations"]}
    assert set(grid) == {(g, c) for g in (0, 2, "auto") for c in (1, 3)}
    assert [r["gamma"] for r in results["configurations"] if r["concurrency"] == 1] == [0, 2, "auto"]
    for c in (1, 3):
        auto = grid[("auto", c)]
        assert auto["errors"] == 0 and auto["acceptance"] is not None and auto["speedup_throughput"] is not None
    (block,) = json.loads((run / "recommendation.json").read_text())["by_temperature"]
    assert all(lv["gamma"] in (0, 2) for lv in block["levels"])  # the schedule is made of fixed γ values
    assert [d["drafter"] for d in block["drafters"]] == ["eagle3 auto", "eagle3 auto"]
    assert (tiny / "draft" / "specops-calibration.json").is_file()  # measured once, by the auto server
    again = subprocess.run(argv + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "6 of 6 configurations already measured" in again.stderr


def test_schedule_device_and_dtype_reach_the_server_and_the_fixed_parameters_only_when_set(tiny):
    from specops.bench.config import SweepConfig
    from specops.bench.servers import backend_config

    base = dict(model=tiny / "target", draft=tiny / "draft", synthetic=4)
    old = SweepConfig(**base).fixed()
    # runs from before these options still resume
    assert not {"gamma_schedule", "device", "dtype", "waves", "client_procs", "api_procs"} & set(old)
    assert SweepConfig(**base, waves=8).fixed() == {**old, "waves": 8}
    assert SweepConfig(**base, client_procs=2).fixed() == {**old, "client_procs": 2}
    assert SweepConfig(**base, api_procs=4).fixed() == {**old, "api_procs": 4}
    assert backend_config(SweepConfig(**base, api_procs=4), 0).api_procs == 4
    assert [SweepConfig(**base, waves=8).timed_requests(c) for c in (1, 8, 64)] == [64, 64, 512]
    cfg = SweepConfig(**base, gammas=[0, "schedule"], gamma_schedule=((1, 4, 5), (5, 64, 3)), device="cuda:1",
                      dtype="bf16")
    cfg.validate()
    assert cfg.fixed() == {**old, "gamma_schedule": [[1, 4, 5], [5, 64, 3]], "device": "cuda:1", "dtype": "bfloat16"}
    argv = backend_config(cfg, "schedule").engine_config().argv()
    flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert (flag("--gamma-schedule"), flag("--gamma")) == ("[[1,4,5],[5,64,3]]", "5")
    assert flag("--draft") == str(tiny / "draft")
    assert (flag("--device"), flag("--dtype")) == ("cuda:1", "bfloat16")
    plain = backend_config(cfg, 0).engine_config().argv()
    assert "--gamma-schedule" not in plain and "--draft" not in plain and "cuda:1" in plain


@pytest.mark.slow
def test_a_gamma_schedule_is_a_configuration_of_its_own(tiny, tmp_path):
    """Against plain decoding, with γ = 3 alone and γ = 1 from two requests on: one client drafts 3 tokens a round,
    three clients fewer; the recommendation compares the schedule with the best fixed γ. Two waves: three clients
    send six timed requests, one client the four of --num-prompts."""
    run = tmp_path / "run"
    done = subprocess.run(sweep_argv(
        "--model", str(tiny / "target"), "--draft", str(tiny / "draft"), "--gamma", "0,schedule",
        "--gamma-schedule", "[[1,1,3],[2,8,1]]", "--concurrency", "1,3", "--temperature", "0", "--dataset",
        str(tiny / "prompts.jsonl"), "--num-prompts", "4", "--waves", "2", "--max-tokens", "12", "--warmup", "1",
        "--slo", "e2e=60s", "--out", str(run)), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = json.loads((run / "results.json").read_text())
    assert results["fixed"]["gamma_schedule"] == [[1, 1, 3], [2, 8, 1]] and results["fixed"]["waves"] == 2
    grid = {(r["gamma"], r["concurrency"]): r for r in results["configurations"]}
    assert set(grid) == {(g, c) for g in (0, "schedule") for c in (1, 3)}
    assert {k: r["requests"] for k, r in grid.items()} == {(g, c): max(4, 2 * c) for g, c in grid}
    alone, together = grid[("schedule", 1)]["acceptance"], grid[("schedule", 3)]["acceptance"]
    assert alone["num_draft_tokens"] == 3 * alone["num_drafts"] > 0
    assert together["num_draft_tokens"] < 3 * together["num_drafts"]
    assert all(r["errors"] == 0 and r["speedup_throughput"] is not None for r in grid.values())
    (block,) = json.loads((run / "recommendation.json").read_text())["by_temperature"]
    assert [d["drafter"] for d in block["drafters"]] == ["eagle3 schedule", "eagle3 schedule"]
    assert "schedule" in (run / "results.csv").read_text()


@pytest.mark.slow
def test_one_server_measures_every_gamma_in_turn(tiny, tmp_path):
    """--one-server: one server for γ 1, 3 and a schedule, its table switched before each point, the γ values taken
    in turn within each repeat; each point drafts by its own table, as the counters show."""
    run = tmp_path / "run"
    done = subprocess.run(sweep_argv(
        "--model", str(tiny / "target"), "--draft", str(tiny / "draft"), "--gamma", "1,3,schedule", "--one-server",
        "--gamma-schedule", "[[1,1,3],[2,8,1]]", "--concurrency", "1,3", "--temperature", "0", "--repeats", "2",
        "--dataset", str(tiny / "prompts.jsonl"), "--num-prompts", "4", "--max-tokens", "12", "--warmup", "1",
        "--slo", "e2e=60s", "--out", str(run)), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ready in") == 1 and "switching between γ 1,3,schedule" in done.stderr
    results = json.loads((run / "results.json").read_text())
    assert results["fixed"]["one_server"] is True
    grid = {(r["gamma"], r["concurrency"]): r["acceptance"] for r in results["configurations"]}
    assert set(grid) == {(g, c) for g in (1, 3, "schedule") for c in (1, 3)}
    for (gamma, concurrency), a in grid.items():
        per_round = a["num_draft_tokens"] / a["num_drafts"]
        if gamma == "schedule":
            assert per_round == 3 if concurrency == 1 else per_round < 3
        else:
            assert per_round == gamma
    conn = sqlite3.connect(f"file:{run / 'runs.sqlite'}?mode=ro", uri=True)
    order = conn.execute("SELECT gamma, concurrency, repeat FROM configs ORDER BY finished_at").fetchall()
    conn.close()
    assert order[:6] == [(1, 1, 0), (3, 1, 0), ("schedule", 1, 0), (1, 1, 1), (3, 1, 1), ("schedule", 1, 1)]


def overlap(records) -> int:
    """Most requests in flight at once, from the records' [start, end] intervals."""
    events = sorted([(r.start_s, 1) for r in records] + [(r.start_s + r.e2e_s, -1) for r in records])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.slow
def test_load_generator_against_the_embedded_server(tiny):
    """Closed and open loop, in one process and spread over two: every request once, never more in flight than the
    concurrency, and (greedy) the same answers whichever process sent them; a refused request and a server that is
    gone are records with the reason, not exceptions."""
    from specops.backends import BackendConfig, start_backend
    from specops.bench import loadgen
    from specops.bench.workload import from_dataset, ordered

    pool = from_dataset(tiny / "prompts.jsonl")
    texts = {}
    with start_backend(BackendConfig(kind="embedded", model=tiny / "target", max_batch=4)) as server:
        for rate, conc, procs in ((None, 1, 1), (None, 3, 1), (50.0, 2, 1), (None, 3, 2), (50.0, 2, 2)):
            spec = loadgen.LoadSpec(server.base_url, server.model_name, concurrency=conc, temperature=0.0,
                                    max_tokens=6, rate=rate, procs=procs)
            seen = []
            res = loadgen.run(ordered(pool, 9, seed=0), spec, lambda n_in, n_done: seen.append((n_in, n_done)))
            recs = res.records
            assert [r.idx for r in recs] == list(range(9)) and all(r.ok for r in recs)
            assert overlap(recs) <= conc
            assert seen[-1] == (0, 9) and max(n for n, _ in seen) <= conc
            assert res.duration_s == pytest.approx(max(r.start_s + r.e2e_s for r in recs))
            assert min(r.start_s for r in recs) >= 0
            for r in recs:
                assert r.tokens_from == "usage" and 1 <= r.output_tokens <= 6 and r.prompt_tokens > 0
                assert 0 < r.ttft_s <= r.e2e_s
                assert len(r.itl_s) + 1 <= r.output_tokens  # one gap per text chunk after the first
                assert r.ttft_s + sum(r.itl_s) <= r.e2e_s + 1e-9
                assert r.text and r.finish_reason in ("stop", "length")
            texts[(rate, conc, procs)] = [r.text for r in recs]
        refused = loadgen.run(ordered(pool, 2, seed=0), loadgen.LoadSpec(server.base_url, "no-such-model", 1, 0.0, 6))
        assert [(r.ok, r.error[:8]) for r in refused.records] == [(False, "HTTP 404")] * 2
    closed = loadgen.run(ordered(pool, 1, seed=0), loadgen.LoadSpec(server.base_url, server.model_name, 1, 0.0, 6))
    assert not closed.records[0].ok and "connect" in closed.records[0].error.lower()  # the server is gone
    assert texts[(None, 3, 2)] == texts[(None, 3, 1)] == texts[(None, 1, 1)]
    assert texts[(50.0, 2, 2)] == texts[(50.0, 2, 1)]


def test_client_processes_one_per_8_clients_within_half_the_cores(monkeypatch):
    from specops.bench.loadgen import client_procs

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [client_procs(c) for c in (1, 8, 9, 16, 32, 64, 512)] == [1, 1, 2, 2, 4, 8, 8]
    assert client_procs(64, requested=3) == 3 and client_procs(2, requested=8) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert client_procs(64) == 1


@pytest.mark.slow
def test_bench_command_prints_one_configuration(tiny):
    done = subprocess.run([sys.executable, "-m", "specops.bench.cli", "bench", "--model", str(tiny / "target"),
                           "--draft", str(tiny / "draft"), "--gamma", "2", "--concurrency", "2",
                           "--rate", "poisson:20", "--dataset", str(tiny / "prompts.jsonl"), "--num-prompts", "4",
                           "--max-tokens", "6", "--warmup", "0"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert (row["gamma"], row["concurrency"], row["requests"], row["errors"]) == (2, 2, 4, 0)
    assert row["acceptance"]["num_draft_tokens"] == 2 * row["acceptance"]["num_drafts"] > 0
    assert row["speedup_throughput"] is None  # no γ = 0 measured
