"""The run store (atomic commits, resume checks, stable keys) and the result tables exported from it."""

from __future__ import annotations

import csv
import hashlib
import json
import sqlite3

import pytest

from specops.bench.record import RequestRecord
from specops.bench.results import cost_per_mtok, export, grid_rows
from specops.bench.store import Point, RunStore, StoredConfig
from specops.errors import SpecopsError

FIXED = {"backend": "embedded", "model": "/m", "max_tokens": 16}


def records(n: int, e2e: float = 1.0, tokens: int = 10) -> list[RequestRecord]:
    return [RequestRecord(i, f"p{i}", 0.1 * i, e2e, True, ttft_s=0.1, itl_s=(0.1,) * (tokens - 1),
                          output_tokens=tokens, prompt_tokens=5, tokens_from="usage", text="{}") for i in range(n)]


def test_point_key_is_stable_and_ignores_number_spelling():
    # the key is a hash of the canonical JSON of the grid parameters, so it survives restarts and code changes
    canon = b'{"concurrency": 4, "gamma": 3, "repeat": 0, "temperature": 0.0}'
    assert Point(3, 4, 0, 0).key == Point(3, 4, 0.0, 0).key == hashlib.sha256(canon).hexdigest()[:20]
    assert len({Point(g, c, t, r).key for g in (0, 3) for c in (1, 4) for t in (0.0, 0.7) for r in (0, 1)}) == 16


def test_the_drafter_is_part_of_a_key_only_when_it_is_not_eagle3():
    assert Point(3, 4, 0.0, 0, "eagle3").key == Point(3, 4, 0.0, 0).key  # runs from before the axis keep their keys
    assert len({Point(3, 4, 0.0, 0, d).key for d in ("eagle3", "schema+eagle3", "schema")}) == 3


def test_a_store_from_before_the_drafter_axis_opens_and_reads_as_eagle3(tmp_path):
    conn = sqlite3.connect(tmp_path / "runs.sqlite")
    conn.executescript("""
        CREATE TABLE configs (key TEXT PRIMARY KEY, gamma INTEGER NOT NULL, concurrency INTEGER NOT NULL,
            temperature REAL NOT NULL, repeat INTEGER NOT NULL, duration_s REAL NOT NULL, spec TEXT,
            finished_at REAL NOT NULL);""")
    conn.execute("INSERT INTO configs VALUES (?, 3, 4, 0.0, 0, 2.0, NULL, 0)", (Point(3, 4, 0.0).key,))
    conn.commit()
    conn.close()
    store = RunStore(tmp_path)
    store.commit(StoredConfig(Point(3, 4, 0.0, 0, "schema+eagle3"), 1.0, None, records(1)))
    points = [c.point for c in store.configs()]
    assert points == [Point(3, 4, 0.0), Point(3, 4, 0.0, 0, "schema+eagle3")]
    rows = grid_rows(store.configs(), {"e2e": 2.0})
    assert [(r["drafter"], r["gamma"]) for r in rows] == [("eagle3", 3), ("schema+eagle3", 3)]
    store.close()


def test_commit_and_read_back(tmp_path):
    store = RunStore.open(tmp_path, FIXED, resume=False)
    spec = {"num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 6, "accepted_per_pos": [3, 2, 1]}
    store.commit(StoredConfig(Point(3, 4, 0.7), 2.5, spec, records(3)))
    store.close()
    store = RunStore.open(tmp_path, FIXED, resume=True)
    (cfg,) = store.configs()
    assert (cfg.point, cfg.duration_s, cfg.spec, cfg.records) == (Point(3, 4, 0.7), 2.5, spec, records(3))
    assert store.done_keys() == {Point(3, 4, 0.7).key}


def test_a_failed_commit_leaves_nothing(tmp_path):
    store = RunStore.open(tmp_path, FIXED, resume=False)
    broken = records(2) + [records(1)[0]]  # duplicate request index violates the primary key mid-transaction
    with pytest.raises(sqlite3.IntegrityError):
        store.commit(StoredConfig(Point(0, 1, 0.0), 1.0, None, broken))
    assert store.done_keys() == set()
    assert store.conn.execute("SELECT count(*) FROM requests").fetchone() == (0,)


def test_a_configuration_is_stored_once(tmp_path):
    store = RunStore.open(tmp_path, FIXED, resume=False)
    store.commit(StoredConfig(Point(0, 1, 0.0), 1.0, None, records(2)))
    with pytest.raises(sqlite3.IntegrityError):
        store.commit(StoredConfig(Point(0, 1, 0.0), 1.0, None, records(2)))
    assert len(store.configs()) == 1


def test_existing_run_needs_resume_and_matching_fixed_parameters(tmp_path):
    store = RunStore.open(tmp_path, FIXED, resume=False)
    store.commit(StoredConfig(Point(0, 1, 0.0), 1.0, None, records(1)))
    store.close()
    with pytest.raises(SpecopsError, match="already holds a run; pass --resume"):
        RunStore.open(tmp_path, FIXED, resume=False)
    with pytest.raises(SpecopsError, match=r"different fixed parameters \(max_tokens: 16 in the run, 32 now\)"):
        RunStore.open(tmp_path, {**FIXED, "max_tokens": 32}, resume=True)
    RunStore.open(tmp_path, FIXED, resume=True).close()


def test_a_run_that_measured_nothing_starts_afresh(tmp_path):
    RunStore.open(tmp_path, FIXED, resume=False).close()  # e.g. the server failed to start
    store = RunStore.open(tmp_path, {**FIXED, "max_tokens": 32}, resume=False)
    assert store.fixed()["max_tokens"] == 32


def stored(gamma, conc, repeat, duration, tokens=10, n=4, spec=None):
    return StoredConfig(Point(gamma, conc, 0.0, repeat), duration, spec, records(n, tokens=tokens))


def test_grid_rows_speedup_acceptance_and_cost():
    # γ = 0: 40 tokens in 2 s and in 4 s → 20 and 10 tok/s; γ = 3: 40 tokens in 1 s and 2 s → 40 and 20 tok/s
    spec = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12, "accepted_per_pos": [6, 4, 2]}
    cfgs = [stored(0, 1, 0, 2.0), stored(0, 1, 1, 4.0), stored(3, 1, 0, 1.0, spec=spec), stored(3, 1, 1, 2.0, spec=spec)]
    base, spec_row = grid_rows(cfgs, {"e2e": 2.0}, hourly_usd=3.0, gpus=2)
    assert (base["gamma"], spec_row["gamma"]) == (0, 3)
    assert base["output_tokens_per_s"] == pytest.approx(15.0)
    assert spec_row["output_tokens_per_s"] == pytest.approx(30.0)
    assert spec_row["speedup_throughput"]["value"] == pytest.approx(2.0)
    assert spec_row["speedup_throughput"]["ci95_low"] < 2.0 < spec_row["speedup_throughput"]["ci95_high"]
    assert spec_row["speedup_latency"]["value"] == pytest.approx(1.0)  # same E2E in the records
    acc = spec_row["acceptance"]  # counters summed over the two repeats
    assert (acc["num_drafts"], acc["num_draft_tokens"], acc["num_accepted_tokens"]) == (20, 60, 24)
    assert acc["acceptance_rate"] == pytest.approx(24 / 60)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 24 / 20)
    assert acc["per_position_rate"] == pytest.approx([12 / 20, 8 / 20, 4 / 20])
    assert base["acceptance"] is None
    # 2 GPUs at $3/h = $6/h; at 30 tok/s a million tokens take 33 333 s → $55.56
    assert spec_row["usd_per_million_output_tokens"] == pytest.approx(6 / 3600 / 30 * 1e6)
    assert spec_row["output_tokens_per_s_per_gpu"] == pytest.approx(15.0)
    assert base["requests"] == 8 and base["repeats"] == 2


def test_one_gpu_with_speculation_against_two_without_in_one_unit():
    # what makes separately run sweeps comparable: USD per million output tokens
    assert cost_per_mtok(2000, 3.0, 1) < cost_per_mtok(3000, 3.0, 2)
    assert cost_per_mtok(0.0, 3.0, 1) is None and cost_per_mtok(10.0, None, 1) is None


def test_export_writes_json_and_csv(tmp_path):
    cfgs = [stored(0, 1, 0, 2.0), stored(0, 4, 0, 1.0)]
    doc = export(tmp_path, FIXED, cfgs, {"e2e": 2.0}, None, 1)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(doc))
    assert on_disk["slo_ms"] == {"e2e": 2000.0} and len(on_disk["runs"]) == 2
    assert "linear" in on_disk["percentile_method"]
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [(r["gamma"], r["concurrency"]) for r in rows] == [("0", "1"), ("0", "4")]
    assert float(rows[1]["output_tokens_per_s"]) == pytest.approx(40.0)
    assert float(rows[0]["e2el_ms_p99"]) == pytest.approx(1000.0)


def test_the_engines_gamma_values_are_stored_sorted_and_exported_as_names(tmp_path):
    spec = {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 6, "accepted_per_pos": [4, 2]}
    store = RunStore.open(tmp_path, FIXED, resume=False)
    for g in ("schedule", 3, "auto", 0):
        store.commit(stored(g, 1, 0, 1.0, spec=None if g == 0 else spec))
    cfgs = store.configs()
    store.close()
    assert sorted(c.point.gamma for c in cfgs if isinstance(c.point.gamma, str)) == ["auto", "schedule"]
    export(tmp_path, FIXED, cfgs, {"e2e": 2.0}, None, 1)
    rows = json.loads((tmp_path / "results.json").read_text())["configurations"]
    assert [r["gamma"] for r in rows] == [0, 3, "auto", "schedule"]
    assert rows[3]["acceptance"]["num_drafts"] == 4 and rows[3]["speedup_throughput"]["value"] == pytest.approx(1.0)
    assert [r["gamma"] for r in csv.DictReader((tmp_path / "results.csv").open())] == ["0", "3", "auto", "schedule"]
