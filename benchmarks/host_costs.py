"""Where the host time of a streamed request goes: CPU per request and per streamed chunk in the server's API
process, its engine process and the load generator.

A small model on a GPU serves hundreds of requests a second; then the Python around the model (HTTP, JSON, SSE
chunks, the load generator's own parsing) can set the pace instead of the device. This starts ``specops serve
--engine-process`` once, loads it from this process in closed loop at two ``--max-tokens`` (short and long answers,
alternated ``--repeats`` times), reads each process's CPU time around every run, and fits
CPU = fixed + per-chunk × chunks per request for each process. It prints the fit and, for each process, the request
rate at which it would need a whole core for answers as long as the long run's (its ceiling), and writes
``host_costs.json`` to ``--out``.

    python benchmarks/host_costs.py                                   # fixture model on the CPU
    python benchmarks/host_costs.py --device cuda --dtype bfloat16     # on a GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from server_procs import cpu_s, processes

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "fixtures" / "commerce-tiny"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--gamma", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=256, help="timed requests per run (default 256)")
    ap.add_argument("--max-tokens", default="16,128", help="two answer lengths to fit against (default 16,128)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    return ap.parse_args()


def main() -> int:
    from specops.backends import BackendConfig, start_backend
    from specops.bench import loadgen, workload

    args = parse()
    lengths = [int(x) for x in args.max_tokens.split(",")]
    cfg = BackendConfig(kind="embedded", model=args.model, draft=args.draft if args.gamma else None, gamma=args.gamma,
                        device=args.device, dtype=args.dtype, max_batch=args.concurrency, served_model_name="m",
                        engine_process=True, startup_timeout_s=600)
    runs = []
    with start_backend(cfg) as server:
        apis, engine = processes(server)
        pool = workload.synthetic(args.requests, 0)
        prompts = workload.ordered(pool, args.requests, 0)
        for _ in range(args.repeats):
            for mt in lengths:
                spec = loadgen.LoadSpec(server.base_url, server.model_name, concurrency=args.concurrency,
                                        temperature=0.0, max_tokens=mt, procs=1)
                a0, e0, c0, w0 = cpu_s(apis), cpu_s([engine]), time.process_time(), time.perf_counter()
                recs = loadgen.run(prompts, spec).records
                used = {"api": cpu_s(apis) - a0, "engine": cpu_s([engine]) - e0, "client": time.process_time() - c0}
                n = len(recs)
                runs.append({"max_tokens": mt, "requests": n, "wall_s": time.perf_counter() - w0,
                             "tokens_per_request": sum(r.output_tokens for r in recs) / n,
                             "chunks_per_request": sum(len(r.itl_s) + 1 for r in recs if r.ok) / n,
                             "cpu_ms_per_request": {k: 1e3 * v / n for k, v in used.items()}})
                print(f"max_tokens {mt}: {runs[-1]['chunks_per_request']:.1f} chunks a request, CPU ms a request "
                      + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1]["cpu_ms_per_request"].items()),
                      file=sys.stderr, flush=True)
    chunks = np.array([r["chunks_per_request"] for r in runs])
    long = max(runs, key=lambda r: r["chunks_per_request"])["chunks_per_request"]
    fits = {}
    print(f"{'process':<8} {'ms a request':>13} {'µs a chunk':>11} {'ceiling req/s':>14}"
          f"  (at {long:.0f} chunks a request)")
    for name in ("api", "engine", "client"):
        y = np.array([r["cpu_ms_per_request"][name] for r in runs])
        per_chunk, fixed = np.polyfit(chunks, y, 1)
        ceiling = 1e3 / (fixed + per_chunk * long)
        fits[name] = {"fixed_ms": fixed, "per_chunk_us": 1e3 * per_chunk, "ceiling_rps": ceiling}
        print(f"{name:<8} {fixed:>13.2f} {1e3 * per_chunk:>11.1f} {ceiling:>14.0f}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(["python", "benchmarks/host_costs.py", *sys.argv[1:]]), "device": args.device,
           "gamma": args.gamma, "concurrency": args.concurrency, "cpus": psutil.cpu_count(), "runs": runs,
           "fit": fits}
    (args.out / "host_costs.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
