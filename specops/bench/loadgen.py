"""Async load generator: streaming OpenAI requests with per-chunk ``perf_counter`` timestamps.

Closed loop (no rate): ``concurrency`` clients, each sends its next request when its last one returns.
Open loop (``rate``): seeded Poisson arrivals at ``rate`` requests/s, at most ``concurrency`` in flight (as
``vllm bench serve --request-rate R --max-concurrency C``); a request's clock starts when it is actually sent.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass
from typing import Callable, Optional

import httpx
import numpy as np

from specops.bench.record import RequestRecord
from specops.bench.workload import Prompt


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


async def send(client: httpx.AsyncClient, spec: LoadSpec, idx: int, p: Prompt, t0: float) -> RequestRecord:
    """One streamed request; failures become a record with ``ok=False`` and the reason."""
    st = time.perf_counter()
    stamps: list[float] = []
    parts: list[str] = []
    usage, finish, error, complete, provenance = None, None, None, False, None
    try:
        async with client.stream("POST", f"{spec.base_url}/{p.endpoint}", json=payload(p, spec, idx)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                error = f"HTTP {resp.status_code}: {body[:200]}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
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
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
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


async def _run(prompts: list[Prompt], spec: LoadSpec, progress: Optional[Progress]) -> LoadResult:
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    limits = httpx.Limits(max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency)
    timeout = httpx.Timeout(spec.timeout_s, connect=10.0)
    records: list[RequestRecord] = []
    in_flight = 0

    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()

        async def one(idx: int, p: Prompt) -> None:
            nonlocal in_flight
            in_flight += 1
            if progress:
                progress(in_flight, len(records))
            rec = await send(client, spec, idx, p, t0)
            in_flight -= 1
            records.append(rec)
            if progress:
                progress(in_flight, len(records))

        if spec.rate is None:
            queue = iter(enumerate(prompts))

            async def client_loop() -> None:
                for idx, p in queue:  # the shared iterator hands each client the next prompt
                    await one(idx, p)

            await asyncio.gather(*(client_loop() for _ in range(min(spec.concurrency, len(prompts)))))
        else:
            arrivals = arrival_times(len(prompts), spec.rate, spec.seed)
            gate = asyncio.Semaphore(spec.concurrency)

            async def arrive(idx: int, p: Prompt, at: float) -> None:
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                async with gate:
                    await one(idx, p)

            await asyncio.gather(*(arrive(i, p, a) for (i, p), a in zip(enumerate(prompts), arrivals)))
    records.sort(key=lambda r: r.idx)
    return LoadResult(records, max((r.start_s + r.e2e_s for r in records), default=0.0))


def run(prompts: list[Prompt], spec: LoadSpec, progress: Optional[Progress] = None) -> LoadResult:
    """Send every prompt (index = position in ``prompts``) and return the records in index order.

    What the process holds already is kept out of the garbage collector's reach while it runs: a full collection
    pauses the client, and a pause while tokens arrive would be recorded as the server's latency."""
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(_run(prompts, spec, progress))
    finally:
        gc.unfreeze()
