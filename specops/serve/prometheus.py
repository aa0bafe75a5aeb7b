"""Prometheus metrics: request counts and latencies, plus speculative-decoding counters under vLLM's names.

The speculative counters are read from the engine's running totals at scrape time, labelled like vLLM's
(``engine``, ``model_name``; per position ``position``), so one parser reads both servers. With several API
processes (``PROMETHEUS_MULTIPROC_DIR`` set, as the server does then), each counts into its own files and a scrape
of any of them adds up all of them; the speculative counters come from the one engine either way.
"""

from __future__ import annotations

import os
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)


class SpecCollector:
    """Exports ``stats()`` (an object with num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos)."""

    def __init__(self, stats: Callable[[], object], model_name: str):
        self._stats, self._labels = stats, {"engine": "0", "model_name": model_name}

    def _family(self, name: str, doc: str, value: float, extra: dict[str, str] | None = None):
        labels = {**self._labels, **(extra or {})}
        fam = CounterMetricFamily(name, doc, labels=list(labels))
        fam.add_metric(list(labels.values()), value)
        return fam

    def collect(self):
        s = self._stats()
        yield self._family("vllm:spec_decode_num_drafts", "Speculative proposals made.", s.num_drafts)
        yield self._family("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", s.num_draft_tokens)
        yield self._family("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", s.num_accepted_tokens)
        labels = {**self._labels, "position": ""}
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens accepted at each draft position.", labels=list(labels))
        for i, n in enumerate(list(s.accepted_per_pos)):
            per_pos.add_metric([*self._labels.values(), str(i)], n)
        yield per_pos


class ServerMetrics:
    def __init__(self, model_name: str, spec_stats: Callable[[], object], outstanding: Callable[[], int]):
        # Set before prometheus_client is first imported (the server does), the variable makes every value a file.
        self._shared = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specops_requests", "Finished HTTP requests.", ["endpoint", "status"], registry=r)
        self.latency = Histogram("specops_request_latency_seconds", "End-to-end request latency.", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("specops_time_to_first_token_seconds", "Time to the first generated token.",
                              ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", ["model_name"], registry=r)
        # bound to its label once: it counts every streamed piece
        self.generated = Counter("vllm:generation_tokens", "Tokens generated.", ["model_name"],
                                 registry=r).labels(model_name)
        self.in_flight = Gauge("specops_requests_in_flight", "Engine requests accepted and not yet finished.",
                               registry=r, multiprocess_mode="livesum")
        self.aborted = Counter("specops_aborted_requests", "Engine requests cancelled (client gone, stop string).",
                               registry=r)
        self.model_name = model_name
        self._outstanding = outstanding
        self._spec = SpecCollector(spec_stats, model_name)
        r.register(self._spec)

    def request_done(self) -> None:
        """After each HTTP request: this process's in-flight gauge, as the others' scrapes read it, is updated."""
        if self._shared:
            self.in_flight.set(self._outstanding())

    def render(self) -> bytes:
        self.in_flight.set(self._outstanding())
        if not self._shared:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(self._spec)
        return generate_latest(registry)
