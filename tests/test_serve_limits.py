"""Server limits and lifecycle: API key, a full queue, clients that leave, SIGTERM draining."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import openai
import pytest
from serve_helpers import FIXTURE, free_port, start_server, stop_server

MODEL = FIXTURE / "target-merged"
KEY = "sk-test"
LONG = {"model": "m", "prompt": "Tell me about", "max_tokens": 300, "ignore_eos": True}


@pytest.fixture(scope="module", params=["--engine-thread", "--engine-process"])
def server(request):
    port = free_port()
    proc = start_server(["--model", str(MODEL), "--served-model-name", "m", "--api-key", KEY, "--max-queue", "1",
                         request.param], port)
    yield f"http://127.0.0.1:{port}", proc
    stop_server(proc)


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def in_flight(url: str) -> int:
    return httpx.get(f"{url}/health").json()["requests_in_flight"]


def wait_idle(url: str, deadline_s: float = 60.0) -> int:
    """In-flight count once it drops to zero, or whatever it is at the deadline."""
    end = time.monotonic() + deadline_s
    while (n := in_flight(url)) and time.monotonic() < end:
        time.sleep(0.05)
    return n


def aborted(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", headers=auth()).text.splitlines():
        if line.startswith("specops_aborted_requests_total"):
            return float(line.split()[-1])
    raise AssertionError("no aborted-requests counter")


def test_api_key_is_required_everywhere_but_health(server):
    url, _ = server
    for headers in ({}, auth("wrong")):
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(f"{url}{path}", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{url}/v1/models", headers=auth()).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200


def test_full_queue_is_429_and_a_disconnect_mid_stream_frees_the_slot(server):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    before = aborted(url)
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}, headers=auth(),
                      timeout=60) as s:
        lines = s.iter_lines()
        assert next(lines).startswith("data: ")
        assert in_flight(url) == 1
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model="m", prompt="x", max_tokens=2)
        assert e.value.body["code"] == "queue_full"
    # The client hung up with most of the 300 tokens still to come.
    assert wait_idle(url) == 0
    assert aborted(url) == before + 1
    assert client.completions.create(model="m", prompt="x", max_tokens=2).choices


def test_a_non_streaming_client_that_gives_up_frees_the_slot(server):
    url, _ = server
    before = aborted(url)
    # 1,000 tokens: more than the engine can produce before the client's timeout, even in a process of its own.
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 1000}, headers=auth(), timeout=0.3)
    assert wait_idle(url) == 0
    assert aborted(url) == before + 1


def test_sigterm_drains_in_flight_requests_then_exits(server):
    # Last in this module: it ends the module's server.
    url, proc = server
    body = {**LONG, "max_tokens": 48, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=auth(), timeout=120) as s:
        lines = s.iter_lines()
        first = next(lines)
        os.killpg(proc.pid, signal.SIGTERM)
        events = [first, *lines]
    data = [e[len("data: "):] for e in events if e.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["usage"]["completion_tokens"] == 48
    assert proc.wait(60) == 0
