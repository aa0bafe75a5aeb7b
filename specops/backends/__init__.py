"""Start a serving backend from one config, wait until it is healthy, hand out its URL, stop it cleanly.

    with start_backend(BackendConfig(kind="vllm", model=..., draft=..., gamma=3)) as server:
        server.base_url, server.model_name   # healthy here; stopped (process group gone) on exit

``embedded`` runs specops' server, ``vllm`` real vLLM, ``external`` any OpenAI-compatible URL. Every request
goes through the same HTTP API and every server's /metrics is read by ``scrape.scrape_spec``.
"""

from __future__ import annotations

from specops.backends import embedded, external, vllm
from specops.backends.base import Backend
from specops.backends.config import BackendConfig
from specops.errors import SpecopsError

BACKENDS = {"embedded": embedded.start, "vllm": vllm.start, "external": external.start}
KINDS = tuple(BACKENDS)

__all__ = ["BACKENDS", "KINDS", "Backend", "BackendConfig", "start_backend"]


def start_backend(cfg: BackendConfig) -> Backend:
    """A healthy backend (use it as a context manager); a failed or interrupted start leaves nothing running."""
    if cfg.kind not in BACKENDS:
        raise SpecopsError(f"backend must be one of {', '.join(KINDS)}, not {cfg.kind!r}")
    cfg.validate()
    return BACKENDS[cfg.kind](cfg)
