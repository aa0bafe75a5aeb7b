"""specops' own server (``python -m specops serve``) as a subprocess of the current interpreter."""

from __future__ import annotations

import sys

from specops.backends.base import Backend, launch
from specops.backends.config import BackendConfig


def command(cfg: BackendConfig, port: int) -> list[str]:
    argv = [sys.executable, "-m", "specops", "serve", *cfg.engine_config().argv(), "--host", cfg.host,
            "--port", str(port), "--served-model-name", cfg.model_name]
    if cfg.api_key:
        argv += ["--api-key", cfg.api_key]
    if cfg.engine_process is not None:
        argv.append("--engine-process" if cfg.engine_process else "--engine-thread")
    if cfg.api_procs != 1:
        argv += ["--api-procs", str(cfg.api_procs)]
    if cfg.gamma_endpoint:
        argv.append("--gamma-endpoint")
    return argv


def start(cfg: BackendConfig) -> Backend:
    return launch(cfg, lambda port: command(cfg, port))
