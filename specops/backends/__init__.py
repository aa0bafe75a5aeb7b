"""Start a serving backend from one config, wait until it is healthy, hand out its URL, stop it cleanly.

    with start_backend(BackendConfig(kind="vllm", model=..., draft=..., gamma=3)) as server:
        server.base_url, server.model_name   # healthy here; stopped (process group gone) on exit

``embedded`` runs specops' server, ``vllm`` real vLLM, ``external`` any OpenAI-compatible URL. Every request
goes through the same HTTP API and every server's /metrics is read by ``metrics.scrape_spec``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Optional

import httpx

from specops.backends.config import BackendConfig
from specops.backends.metrics import SpecCounters, delta, metrics_url, scrape_spec
from specops.backends.process import ServerProcess, free_port
from specops.errors import SpecopsError

__all__ = ["BackendConfig", "Backend", "start_backend", "scrape_spec", "delta", "SpecCounters"]


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

    def spec_counters(self) -> SpecCounters:
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


def _external(cfg: BackendConfig) -> Backend:
    base = cfg.url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    try:
        r = httpx.get(f"{base}/models", headers=headers, timeout=10.0)
        r.raise_for_status()
        served = [m["id"] for m in r.json().get("data", [])]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise SpecopsError(f"external server at {base} does not answer /models: {e}") from None
    name = cfg.served_model_name or (served[0] if served else None)
    if name is None:
        raise SpecopsError(f"external server at {base} lists no models")
    return Backend("external", base, name, cfg.api_key)


def start_backend(cfg: BackendConfig) -> Backend:
    """A healthy backend (use it as a context manager); a failed or interrupted start leaves nothing running."""
    cfg.validate()
    if cfg.kind == "external":
        return _external(cfg)
    from specops.backends import embedded, vllm

    port = cfg.port or free_port(cfg.host)
    backend = Backend(cfg.kind, f"http://{cfg.host}:{port}/v1", cfg.model_name, cfg.api_key,
                      stop_grace_s=cfg.stop_grace_s)
    try:
        if cfg.kind == "embedded":
            argv = embedded.command(cfg, port)
        else:
            model_dir, tmp = vllm.prepare_model(cfg)
            if tmp is not None:
                backend._tmp.append(tmp)
            argv = vllm.command(cfg, model_dir, port)
        backend.process = ServerProcess(argv, name=f"{cfg.kind}-server")
        backend.process.wait_healthy(f"http://{cfg.host}:{port}/health", cfg.startup_timeout_s)
    except BaseException:
        backend.stop()
        raise
    return backend
