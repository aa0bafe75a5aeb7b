"""Backends without a model: metrics parsing, process-group shutdown, the vLLM command line, config checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specops.backends import BackendConfig, start_backend
from specops.backends import vllm as vllm_backend
from specops.backends.process import ServerProcess
from specops.backends.scrape import metrics_url, parse_spec
from specops.engine.stats import SpecStats
from specops.errors import SpecopsError

# The shape of vLLM 0.32's exposition: labels per engine and model, *_created samples, a per-position vector.
VLLM_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 15.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 6.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 2.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_spec_counters_are_summed_over_label_sets():
    c = parse_spec(VLLM_TEXT)
    assert c == SpecStats(15, 45, 18, [11, 6, 1])
    assert c.acceptance_rate == pytest.approx(18 / 45)
    assert c.mean_acceptance_length == pytest.approx(1 + 18 / 15)
    assert c.per_position_rate() == pytest.approx([11 / 15, 6 / 15, 1 / 15])


def test_absent_counters_read_as_zero_and_garbage_is_refused():
    assert parse_spec("# TYPE x counter\nx_total 3\n") == SpecStats()
    with pytest.raises(SpecopsError):
        parse_spec("this is { not prometheus")


def test_delta_pads_positions():
    before = SpecStats(2, 6, 3, [2, 1])
    after = SpecStats(5, 15, 7, [4, 2, 1])
    assert after.since(before) == SpecStats(3, 9, 4, [2, 1, 1])


@pytest.mark.parametrize("url, expected", [
    ("http://h:1/v1", "http://h:1/metrics"), ("http://h:1/v1/", "http://h:1/metrics"),
    ("http://h:1", "http://h:1/metrics"), ("http://h:1/metrics", "http://h:1/metrics"),
])
def test_metrics_url(url, expected):
    assert metrics_url(url) == expected


def test_stop_takes_down_the_whole_process_group(tmp_path):
    # The leader forks a child (as vLLM forks its engine core); both must be gone after stop().
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)"
    p = ServerProcess([sys.executable, "-c", script], name="sleeper")
    time.sleep(0.5)
    assert p.group_alive()
    p.stop(grace_s=5)
    assert not p.group_alive()
    p.log_path.unlink()


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period():
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"
    p = ServerProcess([sys.executable, "-c", script], name="stubborn")
    while "ready" not in p.log_tail():
        time.sleep(0.05)
    assert p.stop(grace_s=0.5) == -9
    assert not p.group_alive()
    p.log_path.unlink()


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux-only")
def test_a_server_dies_with_the_process_that_started_it(tmp_path):
    # A benchmark killed by SIGKILL runs no cleanup: the server it started must not outlive it.
    pid_file = tmp_path / "server.pid"
    parent = (
        "import sys, time; from specops.backends.process import ServerProcess; "
        "p = ServerProcess([sys.executable, '-c', 'import time; time.sleep(300)'], name='orphan'); "
        f"open({str(pid_file)!r}, 'w').write(str(p.proc.pid)); time.sleep(300)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 30
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the parent never started its server"
        time.sleep(0.05)
    server = int(pid_file.read_text())
    os.kill(server, 0)  # running
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_that_dies_at_startup_is_reported_with_its_log():
    p = ServerProcess([sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"], name="broken")
    with pytest.raises(SpecopsError, match="exited with code 3(.|\n)*boom: bad flag"):
        p.wait_healthy("http://127.0.0.1:9/health", timeout_s=30)
    p.stop()
    assert p.log_path.is_file()  # a failed start keeps its log
    p.log_path.unlink()


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_vllm_command_carries_model_draft_gamma_and_passthrough(tmp_path):
    model, draft = _model_dir(tmp_path), tmp_path / "draft"
    draft.mkdir()
    py = tmp_path / "python"
    py.write_text("")
    cfg = BackendConfig(kind="vllm", model=model, draft=draft, gamma=5, vllm_python=py, api_key="k",
                        vllm_args=["--tensor-parallel-size=8", "--gpu-memory-utilization", "0.9"])
    argv = vllm_backend.command(cfg, model, 1234)
    assert argv[:3] == [str(py), "-m", "vllm.entrypoints.openai.api_server"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 5}
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--served-model-name") + 1] == "model"
    assert argv.count("--gpu-memory-utilization") == 1 and argv[-3:] == ["--tensor-parallel-size=8",
                                                                        "--gpu-memory-utilization", "0.9"]
    assert argv[argv.index("--api-key") + 1] == "k"
    cfg.vllm_args = []
    assert argv_value(vllm_backend.command(cfg, model, 1234), "--gpu-memory-utilization") == "0.3"


def argv_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_adapter_mode_serves_the_adapter_under_the_model_name(tmp_path):
    model, lora = _model_dir(tmp_path), tmp_path / "lora"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"r": 24}))
    py = tmp_path / "python"
    py.write_text("")
    cfg = BackendConfig(kind="vllm", model=model, lora=lora, lora_mode="unmerged", vllm_python=py)
    argv = vllm_backend.command(cfg, model, 1)
    assert "--enable-lora" in argv
    assert argv_value(argv, "--lora-modules") == f"{cfg.model_name}={lora}"
    assert argv_value(argv, "--max-lora-rank") == "32"
    assert cfg.model_name == "model+lora"


def test_embedded_command_names_the_engine_layout_only_when_asked(tmp_path):
    from specops.backends import embedded

    cfg = BackendConfig(kind="embedded", model=tmp_path, served_model_name="m")
    layouts = {}
    for choice in (None, True, False):
        cfg.engine_process = choice
        layouts[choice] = {a for a in embedded.command(cfg, 1) if a.startswith("--engine-")}
    assert layouts == {None: set(), True: {"--engine-process"}, False: {"--engine-thread"}}
    cfg.api_procs = 3
    argv = embedded.command(cfg, 1)
    assert argv[argv.index("--api-procs") + 1] == "3"


def test_missing_vllm_python_is_a_clear_error(tmp_path):
    cfg = BackendConfig(kind="vllm", model=_model_dir(tmp_path), vllm_python=tmp_path / "nope")
    with pytest.raises(SpecopsError, match="vLLM python not found"):
        vllm_backend.command(cfg, cfg.model, 1)


@pytest.mark.parametrize("cfg, message", [
    (dict(kind="nope"), "backend must be one of"),
    (dict(kind="external"), "needs a URL"),
    (dict(kind="embedded", model=Path("/no/such/model")), "model directory not found"),
    (dict(kind="vllm", gamma_schedule=((1, 8, 3),)), "--gamma-schedule runs on the embedded backend only"),
])
def test_bad_configs_are_refused_before_anything_starts(cfg, message):
    with pytest.raises(SpecopsError, match=message):
        start_backend(BackendConfig(**cfg))


def test_external_backend_that_does_not_answer_is_an_error():
    with pytest.raises(SpecopsError, match="does not answer"):
        start_backend(BackendConfig(kind="external", url="http://127.0.0.1:9"))
