"""Speculative-decoding counters scraped from any server's Prometheus text (vLLM's or specops'), under vLLM's names.

vLLM labels every sample (``engine``, ``model_name``, and ``position`` for the per-position counter); a server
with several engines or models exposes one sample per label set, so counters are summed over labels.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specops.engine.stats import SpecStats
from specops.errors import SpecopsError

PREFIX = "vllm:spec_decode_"
_SCALARS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"


def metrics_url(base_url_or_metrics_url: str) -> str:
    """``http://h:p/v1`` or ``http://h:p`` → ``http://h:p/metrics``; a URL already ending in /metrics is kept."""
    url = base_url_or_metrics_url.rstrip("/")
    if url.endswith("/metrics"):
        return url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url + "/metrics"


def _metric(sample_name: str) -> str | None:
    """The counter a sample belongs to (``vllm:spec_decode_X_total`` → X); None for others and *_created."""
    if not sample_name.startswith(PREFIX) or sample_name.endswith("_created"):
        return None
    name = sample_name[len(PREFIX):]
    return name[: -len("_total")] if name.endswith("_total") else name


def parse_spec(text: str) -> SpecStats:
    """SpecStats from Prometheus exposition text (zero where a counter is absent)."""
    sums = dict.fromkeys(_SCALARS, 0.0)
    per_pos: dict[int, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise SpecopsError(f"not Prometheus text: {e}") from None
    for fam in families:
        for s in fam.samples:
            name = _metric(s.name)
            if name in sums:
                sums[name] += s.value
            elif name == PER_POS and "position" in s.labels:
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    n = max(per_pos) + 1 if per_pos else 0
    return SpecStats(*(int(round(sums[k])) for k in _SCALARS),
                     accepted_per_pos=[int(round(per_pos.get(i, 0.0))) for i in range(n)])


def scrape_spec(base_url_or_metrics_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> SpecStats:
    """Current speculative counters of a running server (vLLM or specops)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = metrics_url(base_url_or_metrics_url)
    try:
        r = httpx.get(url, headers=headers, timeout=timeout_s)
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise SpecopsError(f"cannot read metrics from {url}: {e}") from None
    return parse_spec(r.text)
