"""Bad input ends `sweep` with one clear line before any server starts or any request is sent; option parsing,
prompt records and order, and the arrival schedule."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from specops.bench import params
from specops.bench.cli import app
from specops.bench.store import gamma_order
from specops.bench.workload import from_dataset, ordered
from specops.errors import SpecopsError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep(*args: str):
    return CliRunner().invoke(app, ["sweep", *args])


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "query": "red shoes under $80"}\n{"prompt": "A blue kettle"}\n', encoding="utf-8")
    return path


@pytest.fixture
def model(tmp_path):
    """A directory that passes for a model until a server loads it."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_grid_value_that_is_not_a_number(tmp_path, dataset):
    r = sweep("--backend", "external", "--url", "http://127.0.0.1:1", "--gamma", "3", "--concurrency", "1,four",
              "--dataset", str(dataset), "--out", str(tmp_path / "run"))
    assert "--concurrency: 'four' is not a number" in one_error_line(r)
    assert not (tmp_path / "run").exists()


def test_unreachable_backend(tmp_path, dataset):
    url = f"http://127.0.0.1:{free_port()}/v1"
    r = sweep("--backend", "external", "--url", url, "--gamma", "0", "--concurrency", "1", "--temperature", "0",
              "--dataset", str(dataset), "--out", str(tmp_path / "run"))
    assert f"external server at {url} does not answer /models" in one_error_line(r)
    assert not (tmp_path / "run" / "results.json").exists()


def test_dataset_without_usable_prompts(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\nnot json\n{"query": "  "}\n{"query": "a", "prompt": "b"}\n\n', encoding="utf-8")
    r = sweep("--backend", "external", "--url", f"http://127.0.0.1:{free_port()}", "--gamma", "0",
              "--dataset", str(bad), "--out", str(tmp_path / "run"))
    assert "no usable requests (4 lines skipped" in one_error_line(r)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["--gamma", "0,3"], "γ > 0 needs --draft"),
    (["--gamma", "1.5"], "--gamma: '1.5' is not a whole number"),
    (["--gamma", "-1"], "--gamma: '-1' is below the minimum 0"),
    (["--gamma", "0", "--temperature", "0,,1"], "--temperature: expected comma-separated numbers"),
    (["--gamma", "0", "--slo", "latency=2s"], "--slo: 'latency=2s' is not KEY=DURATION"),
    (["--gamma", "0", "--rate", "uniform:3"], "--rate: 'uniform:3' is not poisson:R"),
    (["--gamma", "0", "--synthetic", "4"], "give exactly one of --dataset FILE.jsonl or --synthetic N"),
    (["--gamma", "0,schedule"], "--gamma schedule runs the γ table of --gamma-schedule: give it"),
    (["--gamma", "0,3", "--gamma-schedule", "[[1,4,5]]"], "add schedule to --gamma"),
    (["--gamma", "schedule", "--gamma-schedule", "[[1,4,0]]"], "--gamma-schedule never drafts"),
    (["--gamma", "schedule", "--gamma-schedule", "[[2,4,1]]"], "--gamma-schedule: range [2, 4, 1] must start at"),
    (["--gamma", "schedule", "--gamma-schedule", "[[1,4,1]]", "--backend", "vllm"],
     "--gamma schedule is the embedded engine's own"),
    (["--gamma", "0", "--dtype", "int8"], "--dtype must be one of float32, bfloat16, float16, not 'int8'"),
    (["--gamma", "0", "--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["--gamma", "0", "--dtype", "bf16", "--backend", "vllm"], "--device and --dtype are the embedded server's"),
    (["--gamma", "0", "--api-procs", "0"], "--api-procs must be at least 1, got 0"),
    (["--gamma", "0", "--api-procs", "2", "--backend", "vllm"], "--api-procs is the embedded server's"),
    (["--gamma", "0,3", "--one-server"], "γ = 0 and auto need servers of their own"),
    (["--gamma", "3", "--one-server", "--backend", "vllm"], "--one-server switches γ on a running embedded server"),
])
def test_option_errors(tmp_path, dataset, model, args, message):
    r = sweep("--model", str(model), "--dataset", str(dataset), "--out", str(tmp_path / "run"), *args)
    assert message in one_error_line(r)
    assert not (tmp_path / "run").exists()


def test_bench_takes_the_schedule_device_and_dtype_options(dataset, model):
    r = CliRunner().invoke(app, ["bench", "--model", str(model), "--dataset", str(dataset), "--gamma", "schedule",
                                 "--gamma-schedule", "[[1,4,1]]", "--dtype", "bf16", "--device", "tpu"])
    assert "--device must be cpu, cuda or cuda:N, not 'tpu'" in one_error_line(r)


def test_missing_model_directory(tmp_path, dataset):
    r = sweep("--model", str(tmp_path / "nope"), "--gamma", "0", "--dataset", str(dataset), "--out", str(tmp_path / "r"))
    assert "--model: not a model directory" in one_error_line(r)


def test_external_server_serves_one_gamma(tmp_path, dataset):
    r = sweep("--backend", "external", "--url", "http://127.0.0.1:1", "--gamma", "0,3", "--dataset", str(dataset),
              "--out", str(tmp_path / "run"))
    assert "give exactly one --gamma value" in one_error_line(r)


def test_parsing_of_grid_slo_and_rate():
    assert params.int_list("--gamma", "5, 0,3,3", 0) == [0, 3, 5]
    assert params.gamma_list("5,auto,0,AUTO") == [0, 5, "auto"] and params.gamma_list("auto") == ["auto"]
    assert params.gamma_list("schedule,3,auto") == [3, "auto", "schedule"] == sorted(
        ["schedule", "auto", 3], key=gamma_order)
    with pytest.raises(SpecopsError, match="--gamma"):
        params.gamma_list("3,automatic")
    assert params.float_list("--temperature", "0.7,0", 0.0) == [0.0, 0.7]
    assert params.slo("e2e=2000ms,TTFT=0.5s,tpot=40") == {"e2e": 2.0, "ttft": 0.5, "tpot": 0.04}
    assert params.slo("e2el=1s") == {"e2e": 1.0}
    assert params.rate("poisson:2.5") == 2.5 and params.rate(None) is None
    for bad in ("poisson:0", "poisson:x", "poisson"):
        with pytest.raises(SpecopsError):
            params.rate(bad)
    with pytest.raises(SpecopsError, match="not a finite number"):
        params.int_list("--gamma", "nan", 0)


def test_dataset_records_become_requests(tmp_path):
    path = tmp_path / "d.jsonl"
    msgs = [{"role": "user", "content": "hi"}]
    path.write_text("\n".join(json.dumps(r) for r in [{"id": "q", "query": "red shoes"}, {"prompt": "A kettle"},
                                                      {"id": "m", "messages": msgs}, {"messages": []}]) + "\n")
    q, p, m = from_dataset(path)
    assert (q.id, q.endpoint, q.messages[-1]) == ("q", "chat/completions", {"role": "user", "content": "red shoes"})
    assert q.messages[0]["role"] == "system"
    assert (p.id, p.endpoint, p.body()) == ("2", "completions", {"prompt": "A kettle"})
    assert (m.endpoint, m.body()) == ("chat/completions", {"messages": msgs})


def test_prompt_order_is_seeded_and_cycles_the_pool(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "prompt": f"p{i}"}) + "\n" for i in range(3)))
    pool = from_dataset(path)
    a, b = ordered(pool, 7, seed=1), ordered(pool, 7, seed=1)
    assert [x.id for x in a] == [x.id for x in b]
    assert sorted(x.id for x in a[:3]) == sorted(x.id for x in a[3:6]) == ["0", "1", "2"]  # each pass covers the pool
    assert [x.id for x in ordered(pool, 7, seed=2)] != [x.id for x in a] or len(pool) == 1


def test_poisson_arrivals_are_seeded_with_the_requested_rate():
    from specops.bench.loadgen import arrival_times

    a = arrival_times(4000, rate=5.0, seed=3)
    assert a == arrival_times(4000, rate=5.0, seed=3) and a != arrival_times(4000, rate=5.0, seed=4)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert len(a) / a[-1] == pytest.approx(5.0, rel=0.05)
    assert arrival_times(1, 5.0, 0) == [0.0] and arrival_times(0, 5.0, 0) == []
