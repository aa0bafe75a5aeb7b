"""The engine on a thread of the server against the engine in a process of its own, side by side.

On one thread the engine's host work and the HTTP event loop's share one interpreter lock; at high concurrency that
lock can set the pace instead of the device. For each γ this starts ``specops serve`` once with ``--engine-thread``
and once with ``--engine-process`` (same model, same flags), loads each from another process with
``specops bench`` (closed loop, the same synthetic shopper queries) at each concurrency, alternating the two
modes ``--repeats`` times, and reports output tok/s, inter-token and end-to-end latency, and the ratio
process / thread. Prints a table and writes ``engine_process.json`` to ``--out``.

    python benchmarks/engine_process.py                                      # fixture models on the CPU
    python benchmarks/engine_process.py --device cuda --dtype bfloat16       # on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "fixtures" / "commerce-tiny"
MODES = ("thread", "process")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--gammas", default="0,3", help="comma-separated γ values (default 0,3)")
    ap.add_argument("--concurrency", default="16,64", help="comma-separated client counts (default 16,64)")
    ap.add_argument("--requests", type=int, default=256, help="timed requests per measurement (default 256)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="measurements per mode and point, alternated (default 2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-batch", type=int, default=None, help="default: the largest --concurrency")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    return ap.parse_args()


def configs(args, gamma: int) -> dict:
    """One ``specops serve`` per mode for one γ, with the same model and flags."""
    from specops.backends import BackendConfig

    return {mode: BackendConfig(kind="embedded", model=args.model, draft=args.draft if gamma else None, gamma=gamma,
                                device=args.device, dtype=args.dtype, max_batch=args.max_batch,
                                served_model_name="m", engine_process=mode == "process", startup_timeout_s=600)
            for mode in MODES}


def load(args, url: str, gamma: int, concurrency: int) -> dict:
    cmd = [sys.executable, "-m", "specops", "bench", "--backend", "external", "--url", url, "--gamma", str(gamma),
           "--concurrency", str(concurrency), "--synthetic", str(args.requests), "--num-prompts", str(args.requests),
           "--max-tokens", str(args.max_tokens)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout)


def main() -> int:
    from specops.backends import start_backend

    args = parse()
    gammas = [int(g) for g in args.gammas.split(",")]
    conc = [int(c) for c in args.concurrency.split(",")]
    args.max_batch = args.max_batch or max(conc)
    rows = []
    for gamma in gammas:
        with ExitStack() as stack:  # both servers stay up while the points alternate between them
            urls = {mode: stack.enter_context(start_backend(cfg)).base_url
                    for mode, cfg in configs(args, gamma).items()}
            for c in conc:
                runs: dict[str, list[dict]] = {m: [] for m in MODES}
                for _ in range(args.repeats):
                    for mode in MODES:
                        runs[mode].append(load(args, urls[mode], gamma, c))
                row = {"gamma": gamma, "concurrency": c}
                for mode in MODES:
                    row[mode] = {
                        "output_tokens_per_s": [r["output_tokens_per_s"] for r in runs[mode]],
                        "itl_p50_ms": statistics.median(r["itl_ms"]["p50"] for r in runs[mode]),
                        "tpot_p50_ms": statistics.median(r["tpot_ms"]["p50"] for r in runs[mode]),
                        "e2e_p99_ms": statistics.median(r["e2el_ms"]["p99"] for r in runs[mode]),
                    }
                tps = {m: statistics.mean(row[m]["output_tokens_per_s"]) for m in MODES}
                row["ratio"] = tps["process"] / tps["thread"]
                rows.append(row)
                print(f"γ={gamma} c={c}: thread {tps['thread']:.0f} tok/s, process {tps['process']:.0f} tok/s, "
                      f"×{row['ratio']:.2f}", file=sys.stderr, flush=True)
    head = f"{'γ':>2} {'conc':>5} {'thread tok/s':>13} {'process tok/s':>14} {'ratio':>6} " \
           f"{'ITL p50 ms t/p':>15} {'TPOT p50 ms t/p':>16} {'E2E p99 ms t/p':>16}"
    print(head)
    for r in rows:
        t, p = r["thread"], r["process"]
        print(f"{r['gamma']:>2} {r['concurrency']:>5} {statistics.mean(t['output_tokens_per_s']):>13.0f} "
              f"{statistics.mean(p['output_tokens_per_s']):>14.0f} {r['ratio']:>6.2f} "
              f"{t['itl_p50_ms']:>7.2f}/{p['itl_p50_ms']:<7.2f} {t['tpot_p50_ms']:>8.2f}/{p['tpot_p50_ms']:<7.2f} "
              f"{t['e2e_p99_ms']:>8.0f}/{p['e2e_p99_ms']:<7.0f}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(["python", "benchmarks/engine_process.py", *sys.argv[1:]]), "device": args.device,
           "dtype": args.dtype, "model": str(args.model), "requests": args.requests, "max_tokens": args.max_tokens,
           "max_batch": args.max_batch, "rows": rows}
    (args.out / "engine_process.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
