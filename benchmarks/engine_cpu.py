"""Output tokens/s of specops' engine next to real vLLM (CPU build), per concurrency and γ, in one run.

Both engines get the same task prompts (token ids rendered once), greedy decoding and the same ``max_tokens``.
Concurrency c means offline batches of c requests: a point sends ``--batches`` batches of c prompts (at most
``--num-prompts``), one batch after the other, on both sides; so c = 1 is timed on few requests, which keeps
a full run within minutes on two cores. One engine per γ serves every concurrency (vLLM's start-up is a minute on CPU), and
a short warm-up on each engine is left out of the timings. Each engine uses the machine as its makers set it
up: specops runs in this process on torch's threads, vLLM's CPU build binds its worker to the cores it picks.

    python benchmarks/engine_cpu.py --num-prompts 32 --max-tokens 64 --out benchmarks/results/engine_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.engine.stats import SpecStats
from specops.inputs import query_prompt_ids
from specops.peers.vllm.offline import VllmRequest, run_vllm
from specops.task import synth

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "commerce-tiny"
WARMUP_PROMPTS = 2


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _shown(path: Path) -> str:
    """Repository-relative where possible, so results files do not carry one machine's layout."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def run_specops(model: Path, draft: Path | None, gamma: int, prompts: list[list[int]], params: SamplingParams,
                concurrency: dict[int, list[list[int]]], console: Console) -> dict[int, dict]:
    """Per concurrency (mapped to its prompts): wall time, output tokens, tokens/s, spec counters and the
    outputs (for agreement)."""
    engine = Engine.load(model, draft=draft if gamma else None, gamma=gamma, max_batch=max(concurrency))
    engine.generate(prompts[:WARMUP_PROMPTS], params)
    points = {}
    for c, subset in concurrency.items():
        start = time.perf_counter()
        outs = [o for chunk in _chunks(subset, c) for o in engine.generate(chunk, params)]
        wall = time.perf_counter() - start
        spec = SpecStats()
        for o in outs:
            spec.merge(o.spec)
        tokens = sum(len(o.token_ids) for o in outs)
        points[c] = {"wall_s": wall, "output_tokens": tokens, "tokens_per_s": tokens / wall, "spec": spec,
                     "token_ids": [o.token_ids for o in outs]}
        console.print(f"  specops γ={gamma} c={c}: {tokens} tokens in {wall:.1f} s")
    return points


def run_peer(model: Path, draft: Path | None, gamma: int, prompts: list[list[int]], params: SamplingParams,
             concurrency: dict[int, list[list[int]]], vllm_python: str | None) -> tuple[float, dict[int, dict], str]:
    requests = [VllmRequest("warmup", prompts[:WARMUP_PROMPTS], params)]
    requests += [VllmRequest(f"c{c}", subset, params, batch_size=c) for c, subset in concurrency.items()]
    result = run_vllm(model, requests, draft=draft, gamma=gamma, max_num_seqs=max(concurrency),
                      vllm_python=vllm_python)
    points = {}
    for c in concurrency:
        r = result.run(f"c{c}")
        points[c] = {"wall_s": r.wall_s, "output_tokens": r.num_output_tokens, "tokens_per_s": r.output_tokens_per_s,
                     "spec": r.spec, "token_ids": [o.token_ids for o in r.outputs]}
    return result.startup_s, points, result.vllm_version


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--num-prompts", type=int, default=32, help="prompts at most per point")
    ap.add_argument("--batches", type=int, default=4, help="batches of c prompts per point at concurrency c")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=_ints, default=[1, 4, 16], help="comma-separated, e.g. 1,4,16")
    ap.add_argument("--gamma", type=_ints, default=[0, 3], help="comma-separated; 0 = no speculation")
    ap.add_argument("--seed", type=int, default=11, help="seed of the synthetic task queries")
    ap.add_argument("--vllm-python", default=None, help="default: $SPECOPS_VLLM_PYTHON, else .venv-vllm")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "engine_cpu.json")
    args = ap.parse_args()
    if any(g > 0 for g in args.gamma) and not (args.draft / "config.json").is_file():
        ap.error(f"no EAGLE-3 draft at {args.draft} (needed for gamma > 0)")

    console = Console()
    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = [query_prompt_ids(tok, ex.query) for ex in synth.generate(args.num_prompts, seed=args.seed)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    points = {c: prompts[: min(args.num_prompts, c * args.batches)] for c in args.concurrency}
    started = time.perf_counter()
    rows, startups, version = [], {}, None
    for gamma in args.gamma:
        console.print(f"γ={gamma}: specops engine")
        ours = run_specops(args.model, args.draft, gamma, prompts, params, points, console)
        console.print(f"γ={gamma}: vLLM")
        startups[gamma], theirs, version = run_peer(args.model, args.draft, gamma, prompts, params, points,
                                                    args.vllm_python)
        for c in args.concurrency:
            a, b = ours[c], theirs[c]
            agree = sum(x == y for x, y in zip(a.pop("token_ids"), b.pop("token_ids")))
            rows.append({
                "gamma": gamma, "concurrency": c, "num_prompts": len(points[c]), "outputs_agree": agree,
                "specops": {**a, "spec": a["spec"].to_dict()}, "vllm": {**b, "spec": b["spec"].to_dict()},
                "ratio_specops_over_vllm": a["tokens_per_s"] / b["tokens_per_s"],
            })

    table = Table(title=f"output tokens/s, greedy, max_tokens {args.max_tokens}",
                  caption="ratio = specops / vLLM; AL = mean acceptance length; same = identical outputs")
    for col in ("γ", "conc", "specops", "vLLM", "ratio", "AL specops", "AL vLLM", "same"):
        table.add_column(col, justify="right")
    for r in rows:
        s, v = r["specops"], r["vllm"]
        mal = (f"{s['spec']['mean_acceptance_length']:.2f}", f"{v['spec']['mean_acceptance_length']:.2f}") \
            if r["gamma"] else ("-", "-")
        table.add_row(str(r["gamma"]), str(r["concurrency"]), f"{s['tokens_per_s']:.1f}", f"{v['tokens_per_s']:.1f}",
                      f"{r['ratio_specops_over_vllm']:.2f}", *mal, f"{r['outputs_agree']}/{r['num_prompts']}")
    console.print(table)

    doc = {
        "benchmark": "engine_cpu",
        "config": {"model": _shown(args.model), "draft": _shown(args.draft) if any(args.gamma) else None,
                   "num_prompts": args.num_prompts, "batches": args.batches, "max_tokens": args.max_tokens, "concurrency": args.concurrency, "gamma": args.gamma,
                   "seed": args.seed, "temperature": 0.0, "dtype": "float32", "warmup_prompts": WARMUP_PROMPTS},
        "environment": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "vllm": version,
                        "vllm_startup_s": {str(g): s for g, s in startups.items()}},
        "total_s": time.perf_counter() - started,
        "points": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {args.out} ({doc['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
