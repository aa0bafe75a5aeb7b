"""The engine's events on their way to the HTTP handlers, the engine in a process of its own when that process
fails, and several API processes over one engine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from serve_helpers import FIXTURE, REPO, free_port, start_server, stop_server

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


@pytest.mark.timeout(120)
def test_the_event_loop_never_waits_on_a_full_command_pipe():
    """An engine busy writing events reads no commands for a while; a burst of requests meanwhile must not block
    the API process's event loop (which then could not read those events: both sides would wait for good)."""
    import multiprocessing as mp

    from specops.engine.sampling import SamplingParams
    from specops.serve.engine_process import EngineClient

    engine_commands, commands = mp.Pipe(duplex=False)  # nobody reads engine_commands until the end
    events, engine_events = mp.Pipe(duplex=False)
    vocab = json.loads((FIXTURE / "target-merged" / "config.json").read_text())["vocab_size"]
    client = EngineClient((commands, events), FIXTURE / "target-merged", vocab, [0])

    async def main():
        client.start()
        q = asyncio.Queue()
        for i in range(2000):  # some 2 MB of commands: far more than a pipe holds
            client.submit(f"r{i}", list(range(1, 200)), SamplingParams(max_tokens=4), q)
        engine_events.send(("events", [("r7", [5, 6], True, "length", None, False, None)], (0, 0, 0, [])))
        event = await q.get()
        engine_commands.close()  # the writer's sends now fail at once, and it ends
        client.stop(timeout_s=30)
        return event

    event = asyncio.run(main())
    assert (event.token_ids, event.finished, event.finish_reason) == ([5, 6], True, "length")


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


@pytest.fixture()
def two_apis():
    port = free_port()
    proc = start_server(["--model", str(FIXTURE / "target-merged"), "--served-model-name", "m", "--api-procs", "2"],
                        port)
    yield f"http://127.0.0.1:{port}", proc, port
    stop_server(proc)


def api_processes(proc, port: int) -> list[psutil.Process]:
    """The server's processes that listen on ``port``."""
    parent = psutil.Process(proc.pid)
    return [p for p in [parent, *parent.children()]
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in p.net_connections("tcp"))]


def listening(port: int) -> list:
    """Every listening socket on ``port``, whoever holds it."""
    return [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def test_api_processes_share_the_port_the_engine_and_the_metrics(two_apis):
    url, proc, port = two_apis
    apis = api_processes(proc, port)
    assert len(apis) == 2 and len(psutil.Process(proc.pid).children()) >= 2  # and the engine

    def ask(prompt: str, stream: bool) -> str:
        body = {"model": "m", "prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": stream}
        with httpx.Client(timeout=120) as c:  # a connection of its own: the kernel picks the API process
            if not stream:
                return c.post(f"{url}/v1/completions", json=body).json()["choices"][0]["text"]
            with c.stream("POST", f"{url}/v1/completions", json=body) as s:
                data = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
            assert data[-1] == "[DONE]"
            return "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1])

    prompts = [f"Query {i}: red running shoes under {40 + i} dollars" for i in range(24)]
    alone = [ask(p, stream=False) for p in prompts[:6]]
    before = [cpu_s(p) for p in apis]
    with ThreadPoolExecutor(12) as pool:
        together = list(pool.map(lambda ip: ask(ip[1], stream=ip[0] % 2 == 0), enumerate(prompts)))
    assert together[:6] == alone  # each answer came back to its own request, streamed or not
    assert all(together)
    used = [cpu_s(p) - b for p, b in zip(apis, before)]
    assert min(used) > 0.01, f"one API process served nothing: CPU seconds {used}"
    metrics = httpx.get(f"{url}/metrics").text  # whichever process answers, it counts every process's requests
    assert 'specops_requests_total{endpoint="completions",status="200"} 30.0' in metrics
    assert "vllm:spec_decode_num_drafts" in metrics


def test_a_killed_api_process_leaves_the_others_serving_and_the_port_is_not_shared_with_strangers(two_apis):
    url, proc, port = two_apis
    second = start_server_error(["--model", str(FIXTURE / "target-merged"), "--api-procs", "2"], port)
    assert "cannot listen on 127.0.0.1" in second
    child = next(p for p in api_processes(proc, port) if p.pid != proc.pid)
    child.kill()
    end = time.monotonic() + 10
    while len(listening(port)) > 1 and time.monotonic() < end:  # its socket closes (queued connections are reset)
        time.sleep(0.1)
    assert len(listening(port)) == 1
    for i in range(6):  # new connections land on the socket still open
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": f"hi {i}", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


def start_server_error(args: list[str], port: int) -> str:
    """What a server that must refuse to start prints."""
    done = subprocess.run([sys.executable, "-m", "specops.serve", *args, "--host", "127.0.0.1", "--port", str(port)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    return done.stderr


def test_sigterm_to_the_server_drains_every_api_process_then_stops_the_engine(two_apis):
    url, proc, port = two_apis
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    body = {"model": "m", "prompt": "Tell me about", "max_tokens": 120, "ignore_eos": True, "stream": True}
    with ThreadPoolExecutor(4) as pool:
        def stream(_):
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as s:
                return [line for line in s.iter_lines() if line.startswith("data: ")]

        running = [pool.submit(stream, i) for i in range(4)]
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)  # the server alone, as a supervisor would
        finished = [json.loads(f.result()[-2][6:])["choices"][0]["finish_reason"] for f in running]
    assert finished == ["length"] * 4
    assert proc.wait(60) == 0
    end = time.monotonic() + 30
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("api_procs", [1, 2])
def test_the_gamma_endpoint_switches_the_running_engines_table(api_procs):
    """``serve --gamma-endpoint``: a table POSTed through one API process governs the next requests through any of
    them (the reply comes once the engine drafts by it), outputs stay the same, and a bad table is a 400. On the
    engine thread (1) and in the engine process (2)."""
    from specops.backends.scrape import scrape_spec

    port = free_port()
    proc = start_server(["--model", str(FIXTURE / "target-merged"), "--draft", str(FIXTURE / "draft-domain"),
                         "--gamma", "3", "--served-model-name", "m", "--api-procs", str(api_procs),
                         "--gamma-endpoint"], port)
    url = f"http://127.0.0.1:{port}"
    try:
        def ask(prompt: str) -> str:
            body = {"model": "m", "prompt": prompt, "max_tokens": 24, "temperature": 0}
            with httpx.Client(timeout=120) as c:  # a connection of its own: the kernel picks the API process
                return c.post(f"{url}/v1/completions", json=body).json()["choices"][0]["text"]

        prompts = [f"Query {i}: red running shoes under {40 + i} dollars" for i in range(6)]
        answers = {}
        for gamma in (3, 1, 2):
            with httpx.Client(timeout=120) as c:
                r = c.post(f"{url}/admin/gamma-schedule", json={"gamma_schedule": [[1, 64, gamma]]})
            assert r.status_code == 200 and r.json() == {"gamma_schedule": [[1, 64, gamma]]}
            before = scrape_spec(f"{url}/v1")
            answers[gamma] = [ask(p) for p in prompts]
            drafted = scrape_spec(f"{url}/v1").since(before)
            assert drafted.num_drafts > 0 and drafted.num_draft_tokens == gamma * drafted.num_drafts
        assert answers[1] == answers[2] == answers[3]
        for table, message in (([[1, 64, 4]], "more than this engine's γ = 3"), ([[2, 64, 1]], "must start at")):
            r = httpx.post(f"{url}/admin/gamma-schedule", json={"gamma_schedule": table}, timeout=60)
            assert r.status_code == 400 and message in r.json()["error"]["message"]
        assert httpx.post(f"{url}/admin/gamma-schedule", json={"gamma": 3}, timeout=60).status_code in (400, 422)
    finally:
        stop_server(proc)


def test_without_the_flag_there_is_no_gamma_endpoint(two_apis):
    url, _, _ = two_apis
    assert httpx.post(f"{url}/admin/gamma-schedule", json={"gamma_schedule": [[1, 64, 1]]}).status_code == 404
