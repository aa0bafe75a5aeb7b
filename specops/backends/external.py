"""Any OpenAI-compatible server already running at a URL: nothing to start, only checked to answer."""

from __future__ import annotations

import httpx

from specops.backends.base import Backend
from specops.backends.config import BackendConfig
from specops.errors import SpecopsError


def start(cfg: BackendConfig) -> Backend:
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
