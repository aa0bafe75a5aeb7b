"""Fuzzing the real server from its own OpenAPI schema (schemathesis): more than 500 generated requests across
every route, valid and invalid ones; none may get a 5xx, every error must be in OpenAI's error shape, and afterwards the server must
still answer and its memory be back at its level before. Token budgets (``max_tokens``, ``n``) are capped so
the generated requests finish in seconds on a CPU; every other field is as generated."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from serve_helpers import FIXTURE, free_port, start_server, stop_server

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.generation.modes import GenerationMode  # noqa: E402

CASES = {"GET": 40, "POST": 160}  # per operation and mode (valid, invalid): up to 2 × (3 × 40 + 2 × 160) = 880


def rss_mb(pid: int) -> float:
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


def cap(body):
    """Generation bounded: at most 8 tokens and 2 choices a request (other values untouched)."""
    if isinstance(body, dict):
        for key, most in (("max_tokens", 8), ("max_completion_tokens", 8), ("n", 2)):
            if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > most:
                body[key] = most
    return body


@pytest.mark.timeout(900)
def test_generated_requests_never_break_the_server():
    port = free_port()
    proc = start_server(["--model", str(FIXTURE / "target-merged"), "--draft", str(FIXTURE / "draft-domain"),
                         "--gamma", "3", "--max-batch", "4", "--max-queue", "16", "--max-seq-len", "512"], port)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(4):  # the allocator's level after a few real requests is the baseline
            httpx.post(base + "/v1/completions", json={"model": "target-merged", "prompt": "red shoes", "max_tokens": 8},
                       timeout=60)
        before = rss_mb(proc.pid)
        schema = schemathesis.openapi.from_url(base + "/openapi.json")
        seen: list[tuple[str, int]] = []
        bad: list[str] = []
        operations = [r.ok() for r in schema.get_all_operations()]
        assert {op.path for op in operations} >= {"/health", "/metrics", "/v1/models", "/v1/completions",
                                                  "/v1/chat/completions"}
        with httpx.Client(timeout=120) as client:
            for op, mode in ((op, mode) for op in operations for mode in GenerationMode):  # noqa: B023 (runs here)

                @settings(max_examples=CASES.get(op.method.upper(), 40), deadline=None, database=None,
                          derandomize=True, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
                @given(op.as_strategy(generation_mode=mode))
                def one(case):
                    case.body = cap(case.body)
                    kw = case.as_transport_kwargs(base_url=base)
                    r = client.request(kw["method"], kw["url"], params=kw.get("params"), headers=kw.get("headers"),
                                       json=kw.get("json"), content=kw.get("content") or kw.get("data"))
                    seen.append((op.path, r.status_code))
                    if r.status_code >= 500:
                        bad.append(f"{op.method} {op.path} → {r.status_code}: {r.text[:200]}")
                    elif r.status_code >= 400:
                        try:
                            err = r.json().get("error")
                        except ValueError:
                            err = None
                        if not (isinstance(err, dict) and isinstance(err.get("message"), str)
                                and isinstance(err.get("type"), str)):
                            bad.append(f"{op.method} {op.path} → {r.status_code} not in OpenAI's error shape: "
                                       f"{r.text[:200]}")

                try:
                    one()
                except Unsatisfiable:  # nothing invalid to send (a GET without parameters): only valid requests
                    assert mode == GenerationMode.NEGATIVE
        print(f"{len(seen)} requests; statuses {sorted(Counter(s for _, s in seen).items())}")
        assert not bad, "\n".join(bad[:20])
        assert len(seen) >= 500, len(seen)
        assert {p for p, _ in seen} >= {"/v1/completions", "/v1/chat/completions"}
        assert any(s == 200 for p, s in seen if p == "/v1/chat/completions")  # some generated requests were served
        assert httpx.get(base + "/health", timeout=10).status_code == 200
        assert rss_mb(proc.pid) - before < 64  # MB: back to its level
    finally:
        stop_server(proc)
