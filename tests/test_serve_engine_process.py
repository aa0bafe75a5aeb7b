"""The engine's events on their way to the HTTP handlers, and the engine in a process of its own when that
process fails."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import psutil
import pytest
from serve_helpers import FIXTURE, free_port, start_server, stop_server

from specops.serve.runner import Event, Outbox, _Sink


def test_outbox_merges_a_requests_events_until_its_loop_runs():
    async def main():
        loop = asyncio.get_running_loop()
        q1, q2 = asyncio.Queue(), asyncio.Queue()
        a, b, c = _Sink(loop, q1, 0), _Sink(loop, q1, 1), _Sink(loop, q2, 0)
        box = Outbox()
        box.post([(a, Event(0, [1, 2])), (b, Event(1, [7]))])  # one step
        box.post([(a, Event(0, [3])), (c, Event(0, [9]))])  # the next, before the loop ran
        box.post([(a, Event(0, [4], finished=True, finish_reason="length", provenance={"x": 1}))])
        await asyncio.sleep(0)  # the loop runs the one flush queued
        first = [q1.get_nowait() for _ in range(q1.qsize())]
        second = [q2.get_nowait() for _ in range(q2.qsize())]
        box.post([(b, Event(1, [8], finished=True, finish_reason="stop"))])  # after the flush: delivered on its own
        await asyncio.sleep(0)
        return first, second, [q1.get_nowait() for _ in range(q1.qsize())]

    first, second, later = asyncio.run(main())
    assert [(e.tag, e.token_ids, e.finished, e.finish_reason, e.provenance) for e in first] == [
        (0, [1, 2, 3, 4], True, "length", {"x": 1}), (1, [7], False, None, None)]
    assert [(e.tag, e.token_ids) for e in second] == [(0, [9])]
    assert [(e.tag, e.token_ids, e.finished) for e in later] == [(1, [8], True)]


def test_outbox_carries_an_error_over_the_tokens_before_it():
    async def main():
        loop = asyncio.get_running_loop()
        q = asyncio.Queue()
        box = Outbox()
        box.post([(_Sink(loop, q, 0), Event(0, [5]))])
        box.post([(_Sink(loop, q, 0), Event(0, finished=True, error="engine error: boom"))])
        await asyncio.sleep(0)
        return [q.get_nowait() for _ in range(q.qsize())]

    [event] = asyncio.run(main())
    assert event.token_ids == [5] and event.finished and event.error == "engine error: boom"


@pytest.fixture()
def server():
    port = free_port()
    proc = start_server(["--model", str(FIXTURE / "target-merged"), "--served-model-name", "m", "--engine-process"],
                        port)
    yield f"http://127.0.0.1:{port}", proc
    stop_server(proc)


def engine_child(proc) -> psutil.Process:
    [child] = [c for c in psutil.Process(proc.pid).children() if "spawn" in " ".join(c.cmdline())]
    return child


def test_a_dead_engine_process_fails_its_requests_and_health(server):
    url, proc = server
    body = {"model": "m", "prompt": "Tell me about", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as s:
        lines = s.iter_lines()
        assert next(lines).startswith("data: ")
        engine_child(proc).kill()
        data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert "the engine process exited" in json.loads(data[-2])["error"]["message"]
    health = httpx.get(f"{url}/health")
    assert health.status_code == 503 and health.json()["status"] == "engine stopped"
    r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4}, timeout=30)
    assert r.status_code == 503 and "engine has stopped" in r.json()["error"]["message"]
    assert proc.poll() is None  # the server itself stays up, saying why it cannot serve


def test_the_engine_process_ends_with_the_server(server):
    url, proc = server
    child = engine_child(proc)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole group: the engine waits for the server's stop
    assert proc.wait(60) == 0
    end = time.monotonic() + 30
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < end:
        time.sleep(0.1)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
