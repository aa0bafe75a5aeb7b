"""Overload and disconnects against a real ``specops serve`` on loopback; bounded in count and time, stops by itself.

1. ``full``: exactly ``--queue`` requests at once (the server's ``--max-queue``): every one is accepted; their
   latencies are the unloaded reference, their greedy outputs the expected ones.
2. ``overload``: 4 × ``--queue`` requests at once, the same prompts cycled: the excess must get 429 quickly, with
   ``Retry-After``; every accepted request must finish with the reference output for its prompt, and their p99
   latency is compared with the reference's.
3. ``disconnects``: ``--disconnects`` streaming requests, ``--streams`` at a time, each closed after its first
   chunks: afterwards no request may still run (the in-flight count drains to 0 and no more tokens are
   generated), they must be counted as aborted (but for the few that finish before the server sees the client
   go), and the server's memory must return to its level before.

Prints a table and writes ``soak.json`` to ``--out`` (default ``benchmarks/results``). Exit code 1 when a
correctness property fails (timing ratios are reported, not enforced).

    python benchmarks/soak.py                       # fixture models on the CPU, about two minutes
    python benchmarks/soak.py --queue 8 --disconnects 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "fixtures" / "commerce-tiny"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--queue", type=int, default=32, help="the server's --max-queue (default 32)")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--disconnects", type=int, default=1000, help="streams cut mid-response (default 1000)")
    ap.add_argument("--streams", type=int, default=32, help="streams open at once while cutting (default 32)")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="the whole run's limit (default 600)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    return ap.parse_args()


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (every label set) in ``text``."""
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def percentile(xs: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(xs, q)) if xs else None


class Soak:
    def __init__(self, args, base: str, pid: int):
        import httpx

        self.args, self.base, self.pid = args, base, pid
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)  # a connection per request
        self.client = httpx.AsyncClient(base_url=base, timeout=120, limits=limits)
        from specops.fixtures.recipe import heldout_examples

        self.queries = [e.query for e in heldout_examples(16)]
        self.retried = 0  # 429s met while cutting streams

    def body(self, i: int, stream: bool = False) -> dict:
        return {"model": "target-merged", "messages": [{"role": "user", "content": self.queries[i % len(self.queries)]}],
                "max_tokens": self.args.max_tokens, "temperature": 0, "stream": stream}

    async def one(self, i: int) -> dict:
        t = time.perf_counter()
        r = await self.client.post("/v1/chat/completions", json=self.body(i))
        out = {"prompt": i % len(self.queries), "status": r.status_code, "latency_s": time.perf_counter() - t,
               "retry_after": r.headers.get("retry-after")}
        body = r.json()
        if r.status_code == 200:
            out["text"] = body["choices"][0]["message"]["content"]
        else:
            out["error_shape"] = isinstance(body.get("error"), dict) and {"message", "type"} <= set(body["error"])
        return out

    async def burst(self, n: int, prompts: int | None = None) -> list[dict]:
        """``n`` requests at once over the first ``prompts`` queries (default: as many as there are)."""
        return await asyncio.gather(*(self.one(i % (prompts or n)) for i in range(n)))

    async def cut(self, i: int, chunks: int = 2) -> bool:
        """Open a stream, read its first chunks, drop the connection. True when it was cut mid-response. A 429 (the
        slots of streams cut just before are freed a moment later) is retried as a client would, soon."""
        for _ in range(200):
            async with self.client.stream("POST", "/v1/chat/completions", json=self.body(i, stream=True)) as r:
                if r.status_code == 429:
                    self.retried += 1
                    await asyncio.sleep(0.05)
                    continue
                if r.status_code != 200:
                    return False
                seen = 0
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        seen += 1
                        if seen >= chunks:
                            return True  # leaving the block closes the connection
                return False
        return False

    async def scrape(self) -> str:
        return (await self.client.get("/metrics")).text

    async def in_flight(self) -> int:
        return (await self.client.get("/health")).json()["requests_in_flight"]

    async def run(self) -> dict:
        a, res = self.args, {}
        full = await self.burst(a.queue)
        ref = {r["prompt"]: r.get("text") for r in full}
        lat0 = [r["latency_s"] for r in full if r["status"] == 200]
        res["full"] = {"requests": a.queue, "accepted": len(lat0), "p50_s": percentile(lat0, 50),
                       "p99_s": percentile(lat0, 99)}

        over = await self.burst(4 * a.queue, a.queue)  # the reference's prompts, cycled
        ok = [r for r in over if r["status"] == 200]
        busy = [r for r in over if r["status"] == 429]
        lat = [r["latency_s"] for r in ok]
        res["overload"] = {
            "requests": len(over), "accepted": len(ok), "rejected_429": len(busy),
            "other_status": sorted({r["status"] for r in over} - {200, 429}),
            "rejected_with_retry_after": sum(r["retry_after"] is not None for r in busy),
            "rejected_in_error_shape": sum(bool(r.get("error_shape")) for r in busy),
            "rejection_p50_s": percentile([r["latency_s"] for r in busy], 50),
            "rejection_p99_s": percentile([r["latency_s"] for r in busy], 99),
            "accepted_correct": sum(r["text"] == ref[r["prompt"]] for r in ok),
            "accepted_p99_s": percentile(lat, 99),
            "accepted_p99_over_full_p99": percentile(lat, 99) / res["full"]["p99_s"] if lat and lat0 else None,
        }

        await self.burst(8)  # settle the allocator before the memory baseline
        before_rss, before = rss_mb(self.pid), await self.scrape()
        sem, cut = asyncio.Semaphore(a.streams), 0

        async def cut_one(i):
            nonlocal cut
            async with sem:
                ok = await self.cut(i)  # (not ``cut += await``: that reads ``cut`` before awaiting)
            cut += ok

        t = time.perf_counter()
        await asyncio.gather(*(cut_one(i) for i in range(a.disconnects)))
        cutting_s = time.perf_counter() - t
        t = time.perf_counter()
        while await self.in_flight() and time.perf_counter() - t < 60:
            await asyncio.sleep(0.05)
        drain_s = time.perf_counter() - t
        left = await self.in_flight()
        settled = await self.scrape()
        await asyncio.sleep(1.0)
        later = await self.scrape()
        await self.burst(8)
        after_rss = rss_mb(self.pid)
        res["disconnects"] = {
            "streams": a.disconnects, "cut_mid_response": cut, "retried_429": self.retried, "seconds": cutting_s,
            "drain_s": drain_s,
            "in_flight_after": left,
            "aborted": metric(settled, "specops_aborted_requests_total") - metric(before, "specops_aborted_requests_total"),
            "tokens_generated_after_drain": metric(later, "vllm:generation_tokens_total")
            - metric(settled, "vllm:generation_tokens_total"),
            "rss_before_mb": before_rss, "rss_after_mb": after_rss, "rss_growth_mb": after_rss - before_rss,
        }
        res["alive_after"] = (await self.client.get("/health")).status_code == 200
        return res


def checks(res: dict, args) -> dict[str, bool]:
    o, d = res["overload"], res["disconnects"]
    return {
        "full queue all accepted": res["full"]["accepted"] == args.queue,
        "excess rejected with 429": o["rejected_429"] >= o["requests"] - args.queue and not o["other_status"],
        "every 429 has Retry-After, in OpenAI's error shape": o["rejected_with_retry_after"] == o["rejected_429"]
        == o["rejected_in_error_shape"],
        "every accepted request correct": o["accepted_correct"] == o["accepted"],
        "every stream cut mid-response": d["cut_mid_response"] == d["streams"],
        "nothing left running": d["in_flight_after"] == 0 and d["tokens_generated_after_drain"] == 0,
        "most cut requests aborted (a few finish before the server sees the client go)": d["aborted"] >= 0.9 * d["streams"],
        "memory back to its level (within 64 MB)": d["rss_growth_mb"] < 64,
        "server alive after": res["alive_after"],
    }


def main() -> int:
    from specops.backends.process import free_port

    args = parse()
    port = free_port()
    cmd = [sys.executable, "-m", "specops", "serve", "--model", str(args.model), "--draft", str(args.draft),
           "--gamma", "3", "--max-batch", str(args.max_batch), "--max-queue", str(args.queue),
           "--served-model-name", "target-merged", "--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import httpx

        base, t = f"http://127.0.0.1:{port}", time.monotonic()
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited with code {server.returncode} before becoming healthy")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t > 120:
                raise SystemExit("the server did not become healthy within 120 s")
            time.sleep(0.2)

        async def go():
            soak = Soak(args, base, server.pid)
            try:
                return await asyncio.wait_for(soak.run(), args.timeout_s)
            finally:
                await soak.client.aclose()

        res = asyncio.run(go())
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
    res["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    res["checks"] = checks(res, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(res, indent=2) + "\n")
    f, o, d = res["full"], res["overload"], res["disconnects"]
    print(f"full queue ({f['requests']}): accepted {f['accepted']}, p50 {f['p50_s']:.2f} s, p99 {f['p99_s']:.2f} s")
    print(f"overload ({o['requests']}): accepted {o['accepted']} ({o['accepted_correct']} correct), 429 "
          f"{o['rejected_429']} (p50 {1e3 * (o['rejection_p50_s'] or 0):.1f} ms, p99 {1e3 * (o['rejection_p99_s'] or 0):.1f} ms), "
          f"accepted p99 {o['accepted_p99_s']:.2f} s = {o['accepted_p99_over_full_p99']:.2f}× the full queue's")
    print(f"disconnects ({d['streams']}, {args.streams} at a time): cut {d['cut_mid_response']} in {d['seconds']:.1f} s, "
          f"({d['retried_429']} retries after 429), drained in {d['drain_s']:.2f} s, aborted {d['aborted']:.0f}, in flight after {d['in_flight_after']}, "
          f"tokens after {d['tokens_generated_after_drain']:.0f}, RSS {d['rss_before_mb']:.0f} → {d['rss_after_mb']:.0f} MB")
    for name, ok in res["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(res["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
