"""Streaming throughput with 1, 2, ... HTTP processes in front of one engine process (``specops serve --api-procs``).

A small model on a GPU steps a batch of 64 in well under a millisecond; every step is then 64 SSE chunks to
format and send, and every finished request a new one to parse, template and tokenize. One Python process does
that for a few hundred requests a second, and beyond that it, not the engine, sets the pace: requests wait in it
before the engine sees them (time to first token grows with the clients) and the engine's batch runs below the
concurrency. This starts one server per ``--api-procs`` value (all at once, on the same device), loads them in
turn in closed loop, ``--repeats`` rounds, and prints per setting the output tokens/s (and its ratio to the first
setting), TTFT and end-to-end p50/p99, and the CPU the API processes and the engine process used per second of
load; ``api_procs.json`` goes to ``--out``.

    python benchmarks/api_procs.py                                                      # fixture on the CPU
    python benchmarks/api_procs.py --device cuda --dtype bfloat16 --concurrency 64 --api-procs 1,2,4
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
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
    ap.add_argument("--api-procs", default="1,2", help="settings to compare, comma-separated (default 1,2)")
    ap.add_argument("--requests", type=int, default=0, help="timed requests per load (default 8 × concurrency)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the settings (default 2)")
    ap.add_argument("--client-procs", type=int, default=0, help="load generator processes (default: loadgen's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    return ap.parse_args()


def main() -> int:
    from specops.backends import BackendConfig, start_backend
    from specops.bench import loadgen, workload

    args = parse()
    settings = [int(x) for x in args.api_procs.split(",")]
    n = args.requests or 8 * args.concurrency
    prompts = workload.ordered(workload.synthetic(400, 0), n, 0)
    rows = {s: [] for s in settings}
    with ExitStack() as stack:
        servers = {}
        for s in settings:
            cfg = BackendConfig(kind="embedded", model=args.model, draft=args.draft if args.gamma else None,
                                gamma=args.gamma, device=args.device, dtype=args.dtype,
                                max_batch=args.concurrency, served_model_name="m", engine_process=True, api_procs=s,
                                startup_timeout_s=600)
            servers[s] = stack.enter_context(start_backend(cfg))
        for rep in range(args.repeats):
            for s, server in servers.items():
                apis, engine = processes(server)
                spec = loadgen.LoadSpec(server.base_url, "m", concurrency=args.concurrency, temperature=0.0,
                                        max_tokens=args.max_tokens, procs=args.client_procs)
                loadgen.run(prompts[: 2 * args.concurrency], spec)  # warm-up
                a0, e0 = cpu_s(apis), cpu_s([engine])
                res = loadgen.run(prompts, spec)
                a1, e1 = cpu_s(apis), cpu_s([engine])
                ok = [r for r in res.records if r.ok]
                ttft, e2e = (np.array([getattr(r, k) for r in ok]) * 1e3 for k in ("ttft_s", "e2e_s"))
                row = {"api_procs": s, "repeat": rep, "requests": len(res.records), "errors": len(res.records) - len(ok),
                       "output_tokens_per_s": sum(r.output_tokens for r in ok) / res.duration_s,
                       "requests_per_s": len(ok) / res.duration_s,
                       "ttft_ms": {"p50": float(np.median(ttft)), "p99": float(np.percentile(ttft, 99))},
                       "e2e_ms": {"p50": float(np.median(e2e)), "p99": float(np.percentile(e2e, 99))},
                       "api_cpu_per_s": (a1 - a0) / res.duration_s, "engine_cpu_per_s": (e1 - e0) / res.duration_s}
                rows[s].append(row)
                print(f"round {rep + 1}, {s} API process(es): {row['output_tokens_per_s']:.0f} tok/s",
                      file=sys.stderr, flush=True)
    base = np.mean([r["output_tokens_per_s"] for r in rows[settings[0]]])
    summary = []
    print(f"{'API procs':>9} {'tok/s':>9} {'ratio':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'E2E p50':>8} {'E2E p99':>8} "
          f"{'API CPU/s':>9} {'engine CPU/s':>12}")
    for s in settings:
        mean = lambda f: float(np.mean([f(r) for r in rows[s]]))  # noqa: E731
        line = {"api_procs": s, "output_tokens_per_s": mean(lambda r: r["output_tokens_per_s"]),
                "ttft_ms_p50": mean(lambda r: r["ttft_ms"]["p50"]), "ttft_ms_p99": mean(lambda r: r["ttft_ms"]["p99"]),
                "e2e_ms_p50": mean(lambda r: r["e2e_ms"]["p50"]), "e2e_ms_p99": mean(lambda r: r["e2e_ms"]["p99"]),
                "api_cpu_per_s": mean(lambda r: r["api_cpu_per_s"]),
                "engine_cpu_per_s": mean(lambda r: r["engine_cpu_per_s"])}
        line["ratio"] = line["output_tokens_per_s"] / base
        summary.append(line)
        print(f"{s:>9} {line['output_tokens_per_s']:>9.0f} {line['ratio']:>6.2f} {line['ttft_ms_p50']:>9.1f} "
              f"{line['ttft_ms_p99']:>9.1f} {line['e2e_ms_p50']:>8.1f} {line['e2e_ms_p99']:>8.1f} "
              f"{line['api_cpu_per_s']:>9.2f} {line['engine_cpu_per_s']:>12.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(["python", "benchmarks/api_procs.py", *sys.argv[1:]]), "device": args.device,
           "dtype": args.dtype, "gamma": args.gamma, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
           "cpus": psutil.cpu_count(), "summary": summary, "runs": [r for s in settings for r in rows[s]]}
    (args.out / "api_procs.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
