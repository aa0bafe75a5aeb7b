"""The first requests a server answers after it reports ready, against the same requests once it is warm.

With ``--api-procs`` above 1 the kernel spreads new connections over the API processes, so right after start-up
the first few land on processes that have not answered anything yet. Whatever such a process still does before
serving (imports, building its app, a heap collection) is then time the client waits, and in a sweep it shows up as
a time-to-first-token p99 at the first point of every server. This starts the server ``--starts`` times; each time
it sends ``--requests`` streamed chat requests one after another, each on a new connection, as soon as /health
answers, and then the same requests again. It prints the TTFT of the first round (cold) and the second (warm),
their means and the ratio, and writes ``first_requests.json`` to ``--out``.

    python benchmarks/first_requests.py                          # fixture on the CPU, 4 API processes
    python benchmarks/first_requests.py --device cuda --dtype bfloat16 --model DIR --draft DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "fixtures" / "commerce-tiny"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--api-procs", type=int, default=4, help="HTTP processes of the server (default 4)")
    ap.add_argument("--starts", type=int, default=5, help="server starts (default 5)")
    ap.add_argument("--requests", type=int, default=8, help="requests per round (default 8)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    return ap.parse_args()


def ttft_ms(base_url: str, messages: list[dict], max_tokens: int) -> float:
    """Milliseconds to the first streamed token of one chat request to ``base_url`` (ending in /v1), on a
    connection of its own."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    start, first = time.perf_counter(), None
    with httpx.Client(base_url=base_url, timeout=120) as client, \
            client.stream("POST", "/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():  # read to the end: the next request finds the server idle
            if first is None and line.startswith("data: {") and \
                    any(c["delta"].get("content") for c in json.loads(line[6:])["choices"]):
                first = time.perf_counter()
    if first is not None:
        return (first - start) * 1e3
    raise RuntimeError("the server streamed no token")


def main() -> int:
    from specops.backends import BackendConfig, start_backend
    from specops.bench import workload

    args = parse()
    queries = [p.messages for p in workload.synthetic(args.requests, 0)]
    cold, warm = [], []
    for start in range(args.starts):
        cfg = BackendConfig(kind="embedded", model=args.model, draft=args.draft if args.gamma else None,
                            gamma=args.gamma, device=args.device, dtype=args.dtype, served_model_name="m",
                            engine_process=True, api_procs=args.api_procs, startup_timeout_s=600)
        with start_backend(cfg) as server:
            cold.append([ttft_ms(server.base_url, q, args.max_tokens) for q in queries])
            warm.append([ttft_ms(server.base_url, q, args.max_tokens) for q in queries])
        print(f"start {start + 1}: cold " + " ".join(f"{x:.0f}" for x in cold[-1]) + " ms; warm "
              + " ".join(f"{x:.0f}" for x in warm[-1]) + " ms", file=sys.stderr, flush=True)
    c, w = np.array(cold), np.array(warm)
    summary = {"cold_mean_ms": float(c.mean()), "warm_mean_ms": float(w.mean()), "cold_max_ms": float(c.max()),
               "warm_max_ms": float(w.max()), "cold_over_warm": float(c.mean() / w.mean()),
               "cold_by_position_ms": c.mean(axis=0).tolist(), "warm_by_position_ms": w.mean(axis=0).tolist()}
    print(f"{'round':>6} {'mean TTFT':>10} {'max TTFT':>9}  by position (mean over {args.starts} starts)")
    for name, a in (("cold", c), ("warm", w)):
        print(f"{name:>6} {a.mean():>7.1f} ms {a.max():>6.1f} ms  " + " ".join(f"{x:.0f}" for x in a.mean(axis=0)))
    print(f"cold / warm: {summary['cold_over_warm']:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(["python", "benchmarks/first_requests.py", *sys.argv[1:]]), "device": args.device,
           "dtype": args.dtype, "gamma": args.gamma, "api_procs": args.api_procs, "starts": args.starts,
           "requests": args.requests, "cpus": psutil.cpu_count(), "summary": summary, "cold_ms": cold, "warm_ms": warm}
    (args.out / "first_requests.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
