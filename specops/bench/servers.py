"""One server per γ, remembered in the run directory so that a resumed run stops one a killed sweep left behind.

Servers run in their own process group (they must outlive a Ctrl-C long enough to drain), so a sweep that is
SIGKILLed orphans its server, which would keep holding the accelerator's memory and make the resume fail. The
running server's pid and command line are written to ``server.json``; on resume a process with that pid *and* that
command line is stopped (group SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from specops.backends import Backend, BackendConfig, start_backend
from specops.bench.config import SweepConfig
from specops.bench.store import speculative
from specops.engine.config import AUTO_GAMMA_MAX, schedule_gamma

STATE = "server.json"


def backend_config(cfg: SweepConfig, gamma: int | str, drafter: str = "eagle3") -> BackendConfig:
    auto, scheduled = gamma == "auto", gamma == "schedule"
    most = AUTO_GAMMA_MAX if auto else schedule_gamma(cfg.gamma_schedule) if scheduled else max(gamma, 1)
    return BackendConfig(kind=cfg.backend, model=cfg.model, lora=cfg.lora,
                         draft=cfg.draft if speculative(gamma) else None, gamma=most, adaptive_gamma=auto,
                         gamma_schedule=cfg.gamma_schedule if scheduled else None, drafter=drafter,
                         url=cfg.url, api_key=cfg.api_key, vllm_python=cfg.vllm_python, vllm_args=list(cfg.vllm_args), max_batch=cfg.server_max_batch,
                         device=cfg.device, dtype=cfg.dtype, api_procs=cfg.api_procs,
                         gamma_endpoint=cfg.one_server, startup_timeout_s=cfg.startup_timeout_s)


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def stop_stale(run_dir: Path, grace_s: float = 20.0) -> bool:
    """Stop the server a killed sweep of this run left running; True when there was one."""
    state = Path(run_dir) / STATE
    if not state.is_file():
        return False
    info = json.loads(state.read_text())
    pid = int(info["pid"])
    found = _cmdline(pid) == info["argv"]
    if found:
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _cmdline(pid) == info["argv"] and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pid, signal.SIGKILL)
    state.unlink()
    return found


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def preflight(cfg: SweepConfig) -> None:
    """An external server must answer before anything is recorded (the others are checked when they start)."""
    if cfg.backend == "external":
        start_backend(backend_config(cfg, cfg.gammas[0])).stop()


@contextmanager
def serving(cfg: SweepConfig, gamma: int | str, drafter: str = "eagle3") -> Iterator[Backend]:
    """A healthy server for ``gamma`` (no draft at γ = 0) and ``drafter``, recorded in the run directory while it
    runs."""
    state = Path(cfg.out) / STATE
    with start_backend(backend_config(cfg, gamma, drafter)) as server:
        if server.process is not None:
            proc = server.process.proc
            state.write_text(json.dumps({"pid": proc.pid, "argv": [str(a) for a in proc.args]}))
        try:
            yield server
        finally:
            server.stop()
            state.unlink(missing_ok=True)
