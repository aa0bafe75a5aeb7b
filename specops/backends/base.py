"""A running backend as callers see it (URL, served name, how to stop it), and the launch every server kind shares."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Callable, Optional

from specops.backends.config import BackendConfig
from specops.backends.process import ServerProcess, free_port
from specops.backends.scrape import metrics_url, scrape_spec
from specops.engine.stats import SpecStats


@dataclass
class Backend:
    kind: str
    base_url: str  # ends in /v1
    model_name: str
    api_key: Optional[str] = None
    process: Optional[ServerProcess] = None
    stop_grace_s: float = 20.0
    _tmp: list[tempfile.TemporaryDirectory] = field(default_factory=list, repr=False)

    @property
    def metrics_url(self) -> str:
        return metrics_url(self.base_url)

    @property
    def log_path(self):
        return self.process.log_path if self.process else None

    def spec_counters(self) -> SpecStats:
        return scrape_spec(self.base_url, self.api_key)

    def stop(self) -> None:
        """Stop the server (SIGTERM → SIGKILL on its process group) and remove temporary files."""
        if self.process is not None:
            self.process.stop(self.stop_grace_s)
        for t in self._tmp:
            t.cleanup()
        self._tmp.clear()

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch(cfg: BackendConfig, argv_for_port: Callable[[int], list[str]],
           tmp: Optional[tempfile.TemporaryDirectory] = None) -> Backend:
    """Start the server ``argv_for_port(port)`` and wait until /health answers; a failed or interrupted start
    leaves nothing running (``tmp``, a directory the server reads, is removed with the backend)."""
    backend = Backend(cfg.kind, "", cfg.model_name, cfg.api_key, stop_grace_s=cfg.stop_grace_s,
                      _tmp=[tmp] if tmp is not None else [])
    try:
        port = cfg.port or free_port(cfg.host)
        backend.base_url = f"http://{cfg.host}:{port}/v1"
        backend.process = ServerProcess(argv_for_port(port), name=f"{cfg.kind}-server")
        backend.process.wait_healthy(f"http://{cfg.host}:{port}/health", cfg.startup_timeout_s)
    except BaseException:
        backend.stop()
        raise
    return backend
