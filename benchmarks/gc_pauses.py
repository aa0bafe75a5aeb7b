"""Garbage-collector pauses in the serving process under load, with its start-up heap frozen (what ``specops serve``
does) and without.

A full collection walks every object the process holds (torch, the model, the tokenizer, the app: some 400 k) while
holding the GIL, so the engine thread and every stream stop for it. Each variant runs in a fresh process: the
embedded server on loopback, loaded by ``specops bench`` from another process (closed loop), while
``gc.callbacks`` times every collection in the server. Prints a table and writes ``gc_pauses.json`` to ``--out``.

    python benchmarks/gc_pauses.py                  # fixture models on the CPU, about a minute
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "fixtures" / "commerce-tiny"
VARIANTS = ("frozen", "unfrozen")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512, help="timed requests per variant (default 512)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child process's own run
    return ap.parse_args()


def serve_and_load(args) -> dict:
    """One variant, in this process: the server here, the load from a child ``specops bench``."""
    import gc

    import uvicorn

    from specops.backends.process import free_port
    from specops.engine.engine import Engine
    from specops.serve.app import create_app
    from specops.serve.runner import EngineRunner
    from specops.serve.server import build_state, settle_heap

    engine = Engine.load(args.model, draft=args.draft, gamma=args.gamma, max_batch=args.concurrency,
                         device=args.device)
    app = create_app(build_state(EngineRunner(engine), model_name="m", max_seq_len=1024, max_queue=4 * args.concurrency))
    if args.variant == "frozen":
        settle_heap()
    tracked = len(gc.get_objects())  # what a full collection walks (frozen objects are not listed)
    pauses, started = [], [0.0]

    def timed(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    gc.callbacks.append(timed)
    cmd = [sys.executable, "-m", "specops", "bench", "--backend", "external", "--url", f"http://127.0.0.1:{port}/v1",
           "--gamma", str(args.gamma), "--concurrency", str(args.concurrency), "--synthetic", str(args.requests),
           "--num-prompts", str(args.requests), "--max-tokens", str(args.max_tokens)]
    bench = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout)
    gc.callbacks.remove(timed)
    server.should_exit = True
    thread.join()
    full = [d for g, d in pauses if g == 2]
    return {"variant": args.variant, "collectable_objects": tracked, "collections": len(pauses),
            "full_collections": len(full), "longest_pause_ms": 1e3 * max((d for _, d in pauses), default=0.0),
            "longest_full_ms": 1e3 * max(full, default=0.0), "paused_ms": 1e3 * sum(d for _, d in pauses),
            "output_tokens_per_s": bench["output_tokens_per_s"], "ttft_p99_ms": bench["ttft_ms"]["p99"],
            "e2e_p99_ms": bench["e2el_ms"]["p99"]}


def main() -> int:
    args = parse()
    if args.variant:
        print(json.dumps(serve_and_load(args)))
        return 0
    rows = []
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", variant], check=True,
                             capture_output=True, text=True, cwd=REPO).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    cols = ["variant", "collectable_objects", "collections", "full_collections", "longest_full_ms", "longest_pause_ms",
            "paused_ms", "output_tokens_per_s", "ttft_p99_ms", "e2e_p99_ms"]
    print("  ".join(f"{c:>{len(c)}}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]:>{len(c)}.1f}" if isinstance(r[c], float) else f"{r[c]:>{len(c)}}" for c in cols))
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(["python", "benchmarks/gc_pauses.py", *sys.argv[1:]]), "concurrency": args.concurrency,
           "requests": args.requests, "gamma": args.gamma, "device": args.device, "variants": rows}
    (args.out / "gc_pauses.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
