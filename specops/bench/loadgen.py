"""Async load generator: streaming OpenAI requests with per-chunk ``perf_counter`` timestamps.

Closed loop (no rate): ``concurrency`` clients, each sends its next request when its last one returns.
Open loop (``rate``): seeded Poisson arrivals at ``rate`` requests/s, at most ``concurrency`` in flight (as
``vllm bench serve --request-rate R --max-concurrency C``); a request's clock starts when it is actually sent.
At high request rates the clients are spread over several processes (``client_procs``) that start together; closed-loop
clients of all of them take prompts from one shared counter, open-loop arrivals are dealt out in turn and the in-flight
cap is split between them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing as mp
import os
import queue
import time
from dataclasses import dataclass
from typing import Callable, Optional

import aiohttp
import numpy as np

from specops.bench.record import RequestRecord
from specops.bench.workload import Prompt
from specops.errors import SpecopsError


@dataclass(frozen=True)
class LoadSpec:
    base_url: str  # ends in /v1
    model: str
    concurrency: int
    temperature: float
    max_tokens: int
    rate: Optional[float] = None
    seed: int = 0
    api_key: Optional[str] = None
    top_p: float = 1.0
    ignore_eos: bool = False
    timeout_s: float = 300.0
    provenance: bool = False  # ask the server (specops) for each answer's draft provenance
    response_format: Optional[dict] = None  # sent with every request (a json_schema constraint)
    procs: int = 0  # client processes (0: client_procs' choice)


@dataclass(frozen=True)
class LoadResult:
    records: list[RequestRecord]
    duration_s: float  # start of the timed phase (the first send) → the last stream's end


Progress = Callable[[int, int], None]  # (in flight, finished)


def payload(p: Prompt, spec: LoadSpec, idx: int) -> dict:
    body = {"model": spec.model, **p.body(), "max_tokens": spec.max_tokens, "temperature": spec.temperature,
            "top_p": spec.top_p, "stream": True, "stream_options": {"include_usage": True}}
    if spec.temperature > 0:
        body["seed"] = spec.seed + idx  # same sampling seed for the same request in every configuration
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.provenance:
        body["provenance"] = True
    if spec.response_format is not None:
        body["response_format"] = spec.response_format
    return body


def _chunk_text(choice: dict) -> str:
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def _run_loop(coro):
    """Run the clients on uvloop when it is installed: the client's own time per chunk is inside every latency it
    records, and at high concurrency it can cap what a fast server shows."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def send(client: aiohttp.ClientSession, spec: LoadSpec, idx: int, p: Prompt, t0: float) -> RequestRecord:
    """One streamed request; failures become a record with ``ok=False`` and the reason."""
    st = time.perf_counter()
    stamps: list[float] = []
    parts: list[str] = []
    usage, finish, error, complete, provenance = None, None, None, False, None
    try:
        async with client.post(f"{spec.base_url}/{p.endpoint}", json=payload(p, spec, idx)) as resp:
            if resp.status != 200:
                body = (await resp.read()).decode(errors="replace")
                error = f"HTTP {resp.status}: {body[:200]}"
            else:
                async for line in resp.content:  # one SSE line at a time, as bytes
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        complete = True
                        break
                    now = time.perf_counter()
                    msg = json.loads(data)
                    if "error" in msg:
                        error = str(msg["error"])[:200]
                        break
                    if msg.get("usage"):
                        usage = msg["usage"]
                    for choice in msg.get("choices") or []:
                        text = _chunk_text(choice)
                        if text:
                            stamps.append(now)
                            parts.append(text)
                        finish = choice.get("finish_reason") or finish
                        provenance = choice.get("provenance") or provenance
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as e:  # ValueError: bad JSON, an oversized line
        error = f"{type(e).__name__}: {e}"[:200]
    end = time.perf_counter()
    if error is None and not complete:
        error = "the stream ended without [DONE]"
    if error is None and not stamps:
        error = "no text in the stream (TTFT undefined; vllm bench serve counts this as a failure too)"
    tokens_from = "usage" if usage and usage.get("completion_tokens") is not None else "chunks"
    return RequestRecord(
        idx=idx, prompt_id=p.id, start_s=st - t0, ok=error is None,
        ttft_s=stamps[0] - st if stamps else None, e2e_s=end - st,
        itl_s=tuple(float(b - a) for a, b in zip(stamps, stamps[1:])),
        output_tokens=int(usage["completion_tokens"]) if tokens_from == "usage" else len(stamps),
        prompt_tokens=int(usage["prompt_tokens"]) if usage and usage.get("prompt_tokens") is not None else None,
        tokens_from=tokens_from, finish_reason=finish, error=error, text="".join(parts), provenance=provenance,
    )


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Seeded Poisson process: the first request at 0, then exponential gaps with mean 1/rate seconds."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, max(n - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


async def _clients(prompts: list[Prompt], spec: LoadSpec, clients: int, take: Callable[[], Optional[int]],
                   arrivals: Optional[list[tuple[int, float]]], changed: Callable[[int, int], None],
                   ready: Optional[Callable[[], float]] = None) -> list[RequestRecord]:
    """``clients`` closed-loop clients, each taking the next prompt index from ``take()`` (None: none left); or, with
    ``arrivals`` ((index, seconds after t0) pairs), open loop with at most ``clients`` in flight. The timed phase
    starts once the HTTP client exists, at the ``perf_counter`` that ``ready()`` returns (None: now): the client's
    set-up is not the server's time. ``changed(in_flight, finished)`` follows progress."""
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s, sock_connect=10.0)
    records: list[RequestRecord] = []
    in_flight = 0

    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=clients), timeout=timeout,
                                     read_bufsize=1 << 20) as client:
        t0 = time.perf_counter() if ready is None else ready()

        async def one(idx: int) -> None:
            nonlocal in_flight
            in_flight += 1
            changed(in_flight, len(records))
            rec = await send(client, spec, idx, prompts[idx], t0)
            in_flight -= 1
            records.append(rec)
            changed(in_flight, len(records))

        if arrivals is None:
            async def client_loop() -> None:
                while (idx := take()) is not None:
                    await one(idx)

            await asyncio.gather(*(client_loop() for _ in range(clients)))
        else:
            gate = asyncio.Semaphore(clients)

            async def arrive(idx: int, at: float) -> None:
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                async with gate:
                    await one(idx)

            await asyncio.gather(*(arrive(i, a) for i, a in arrivals))
    return records


def client_procs(concurrency: int, requested: int = 0) -> int:
    """Processes the clients are spread over: ``requested``, or when 0 one per 8 clients, at most half the cores.

    One Python process streaming SSE spends a few milliseconds of CPU per request (HTTP, JSON, timestamps: about
    0.3 ms plus 40 µs a chunk); at the hundreds of requests a second a GPU serves a small model at, one process for
    16 clients would be half busy, and the waits in its event loop would be recorded as the server's latency."""
    n = requested or min(-(-concurrency // 8), max(1, (os.cpu_count() or 1) // 2))
    return max(1, min(n, concurrency))


def _share(total: int, parts: int, i: int) -> int:
    return total // parts + (i < total % parts)


def _worker(prompts, spec, clients, arrivals, counter, start, t0, status, results, w) -> None:
    """One client process: builds its HTTP client, waits for the common start, then runs its clients. Closed-loop
    clients of every process take indices from the one shared counter: each prompt is sent once, in order, by
    whichever client is free first, as in one process."""
    def take() -> Optional[int]:
        with counter.get_lock():
            idx = counter.value
            if idx >= len(prompts):
                return None
            counter.value += 1
            return idx

    def changed(in_flight: int, finished: int) -> None:
        status[2 * w], status[2 * w + 1] = in_flight, finished

    def ready() -> float:  # blocks the event loop, on which nothing runs yet
        results.put(("ready", w, None))
        start.wait()
        return t0.value

    gc.collect()
    gc.freeze()
    try:
        records = _run_loop(_clients(prompts, spec, clients, take, arrivals, changed, ready))
        results.put(("done", w, records))
    except BaseException as e:  # reported to the parent, which raises it with the worker's number
        results.put(("error", w, f"{type(e).__name__}: {e}"))


def _run_procs(prompts: list[Prompt], spec: LoadSpec, procs: int, progress: Optional[Progress]) -> list[RequestRecord]:
    ctx = mp.get_context("spawn")  # not fork: the parent may hold threads (progress bars)
    counter, start, t0 = ctx.Value("l", 0), ctx.Event(), ctx.Value("d", 0.0)
    status, results = ctx.Array("l", 2 * procs), ctx.Queue()
    arrivals = None
    if spec.rate is not None:
        arrivals = list(enumerate(arrival_times(len(prompts), spec.rate, spec.seed)))
    workers = [ctx.Process(target=_worker, daemon=True, name=f"specops-client-{w}", args=(
        prompts, spec, _share(spec.concurrency, procs, w), arrivals and arrivals[w::procs], counter, start, t0,
        status, results, w)) for w in range(procs)]
    for p in workers:
        p.start()
    try:
        records: list[RequestRecord] = []
        waiting, ready = set(range(procs)), 0
        while waiting:
            try:
                kind, w, data = results.get(timeout=0.1)
            except queue.Empty:
                dead = [p.name for p in workers if p.exitcode not in (None, 0)]
                if dead:
                    raise SpecopsError(f"load generator process {dead[0]} died") from None
                if progress and ready == procs:
                    progress(sum(status[0::2]), sum(status[1::2]))
                continue
            if kind == "ready":
                ready += 1
                if ready == procs:
                    t0.value = time.perf_counter()
                    start.set()
            elif kind == "error":
                raise SpecopsError(f"load generator process {w} failed: {data}")
            else:
                records += data
                waiting.discard(w)
        if progress:
            progress(0, len(records))
        return records
    finally:
        start.set()
        for p in workers:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


def run(prompts: list[Prompt], spec: LoadSpec, progress: Optional[Progress] = None) -> LoadResult:
    """Send every prompt (index = position in ``prompts``) and return the records in index order.

    What the process holds already is kept out of the garbage collector's reach while it runs: a full collection
    pauses the client, and a pause while tokens arrive would be recorded as the server's latency."""
    procs = client_procs(spec.concurrency, spec.procs)
    if procs > 1:
        records = _run_procs(prompts, spec, procs, progress)
    else:
        order = iter(range(len(prompts)))
        arrivals = None if spec.rate is None else list(enumerate(arrival_times(len(prompts), spec.rate, spec.seed)))
        gc.collect()
        gc.freeze()
        try:
            records = _run_loop(_clients(prompts, spec, min(spec.concurrency, len(prompts)),
                                         lambda: next(order, None), arrivals, progress or (lambda *_: None)))
        finally:
            gc.unfreeze()
    records.sort(key=lambda r: r.idx)
    return LoadResult(records, max((r.start_s + r.e2e_s for r in records), default=0.0))
