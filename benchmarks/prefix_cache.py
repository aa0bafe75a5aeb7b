"""The engine with and without its prefix cache, side by side: the task's prompts share their system prompt and
chat template (173 of about 195 tokens), so with the cache a prefill computes each prompt's own tokens only.

For each γ and each setting, one engine serves the held-out commerce queries as a loaded server admits them: a
closed loop of ``--concurrency`` requests, a new one joining as one finishes (``Engine.step`` with requests added
between steps), greedy, ``--max-tokens`` each. Printed and written per point: the prompt tokens the prefills
computed, the time spent in prefills (each timed between two device syncs), the wall time and output tokens/s, and
how many requests' outputs differ from the uncached engine's first run in any run. In float32 that must be none (the
exit code says so); in bfloat16 the rounding depends on the shapes a prefill and a verification run in, so the
count is reported, not checked. The settings alternate over ``--repeats`` runs, and the table keeps each one's
fastest.

    python benchmarks/prefix_cache.py                                    # fixture, CPU
    python benchmarks/prefix_cache.py --device cuda --dtype bfloat16 --model DIR --draft DIR --concurrency 64
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "fixtures" / "commerce-tiny"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--gamma", default="0,3", help="comma-separated γ values (default 0,3)")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    ap.add_argument("--requests", type=int, default=96, help="timed requests per run (default 96)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting, alternating (default 3)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    return ap.parse_args()


def closed_loop(engine, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """Serve ``prompts`` with ``concurrency`` in flight; returns tokens, times and outputs."""
    from specops.engine.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    queue, outputs, computed, prefill_s = list(enumerate(prompts)), {}, 0, 0.0
    prefill = engine.runner.prefill

    def counted(slots, ps, *a, **kw):  # the prefill alone, timed between two syncs
        nonlocal computed, prefill_s
        computed += sum(engine.runner.uncached(p) for p in ps)
        sync()
        t = time.perf_counter()
        pending = prefill(slots, ps, *a, **kw)
        sync()
        prefill_s += time.perf_counter() - t
        return pending

    engine.runner.prefill = counted
    in_flight = 0
    sync()
    start = time.perf_counter()
    while queue or in_flight:
        while queue and in_flight < concurrency:
            i, p = queue.pop(0)
            engine.add_request(str(i), p, params)
            in_flight += 1
        for so in engine.step():
            if so.finished:
                outputs[int(so.request_id)] = so.output.token_ids
                in_flight -= 1
    sync()
    wall = time.perf_counter() - start
    engine.runner.prefill = prefill
    tokens = sum(len(o) for o in outputs.values())
    return {"wall_s": wall, "prefill_s": prefill_s, "prompt_tokens": sum(map(len, prompts)),
            "computed_tokens": computed, "output_tokens": tokens, "output_tokens_per_s": tokens / wall,
            "outputs": [outputs[i] for i in range(len(prompts))]}


def main() -> int:
    from specops.engine.config import canonical_dtype
    from specops.engine.engine import Engine
    from specops.fixtures.recipe import heldout_examples
    from specops.inputs import query_prompt_ids

    args = parse()
    gammas = [int(g) for g in args.gamma.split(",")]
    queries = [e.query for e in heldout_examples(100)]
    rows = []
    for gamma in gammas:
        engines = {cached: Engine.load(args.model, args.draft if gamma else None, gamma=gamma, device=args.device,
                                       dtype=args.dtype, max_batch=args.concurrency, prefix_cache=cached)
                   for cached in (False, True)}
        prompts = [query_prompt_ids(engines[False].tokenizer, queries[i % len(queries)]) for i in range(args.requests)]
        runs = {False: [], True: []}
        for engine in engines.values():  # warm-up (and, with the cache, the system prompt kept)
            closed_loop(engine, prompts[: 2 * args.concurrency], args.concurrency, args.max_tokens)
        for _ in range(args.repeats):
            for cached, engine in engines.items():
                runs[cached].append(closed_loop(engine, prompts, args.concurrency, args.max_tokens))
        best = {cached: min(r, key=lambda x: x["wall_s"]) for cached, r in runs.items()}
        base = runs[False][0]["outputs"]
        for cached in (False, True):
            b = best[cached]
            differ = max(sum(a != o for a, o in zip(r["outputs"], base)) for r in runs[cached])
            rows.append({"gamma": gamma, "prefix_cache": cached, "differing_outputs": differ,
                         **{k: v for k, v in b.items() if k != "outputs"},
                         "wall_s_runs": [r["wall_s"] for r in runs[cached]]})
        del engines
    print(f"{'γ':>2} {'prefix cache':>12} {'prompt tok':>10} {'computed':>9} {'prefills s':>10} {'wall s':>8} "
          f"{'out tok/s':>10}  {'vs off':>6}  differing outputs")
    for r in rows:
        off = next(x for x in rows if x["gamma"] == r["gamma"] and not x["prefix_cache"])
        print(f"{r['gamma']:>2} {'on' if r['prefix_cache'] else 'off':>12} {r['prompt_tokens']:>10} "
              f"{r['computed_tokens']:>9} {r['prefill_s']:>10.3f} {r['wall_s']:>8.3f} "
              f"{r['output_tokens_per_s']:>10.1f}  {r['output_tokens_per_s'] / off['output_tokens_per_s']:>5.2f}×  "
              f"{r['differing_outputs']:>5} of {args.requests}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(["python", "benchmarks/prefix_cache.py", *sys.argv[1:]]), "device": args.device,
           "dtype": args.dtype, "concurrency": args.concurrency, "requests": args.requests,
           "max_tokens": args.max_tokens, "repeats": args.repeats, "threads": torch.get_num_threads(), "rows": rows}
    name = "prefix_cache.json" if args.device == "cpu" else f"prefix_cache-{args.device.split(':')[0]}.json"
    (args.out / name).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    exact = canonical_dtype(args.dtype) == "float32"
    return 1 if exact and any(r["differing_outputs"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
