"""Schema-aware drafting next to plain EAGLE-3, under the commerce schema, greedy, on held-out queries.

Every configuration decodes the same prompts under the contract's JSON schema (``response_format`` json_schema):
plain constrained decoding, ``schema`` (forced tokens alone, no draft model), and for each draft ``eagle3`` and
``schema+eagle3`` at the same γ. Per configuration and concurrency it reports output tokens/s (the median of
``--repeats`` timed passes), tokens per target forward (emitted tokens after the first / decode rounds: the
figure schema-aware drafting raises), vLLM's mean acceptance length (1 + accepted / drafts; rounds that drafted
nothing are not drafts), acceptance on the tokens the schema fixes (structure, quotes, key names), and whether
the outputs equal plain constrained decoding token for token. Concurrency c means batches of c requests decoded
together (c = 1: one request at a time).

    python benchmarks/schema_drafting.py --out benchmarks/results/schema_drafting.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specops.analysis.acceptance import Tally
from specops.analysis.alignment import token_classes
from specops.analysis.json_lexer import SCHEMA as SCHEMA_CLASSES
from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.engine.stats import SpecStats
from specops.fixtures.recipe import heldout_examples
from specops.inputs import query_prompt_ids
from specops.task.schema import SCHEMA

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "commerce-tiny"
FORMAT = {"type": "json_schema", "json_schema": {"name": "commerce_search", "schema": SCHEMA}}
GOALS = {"per_forward_general": 1.5, "per_forward_domain": 1.25, "tokens_per_s": 1.15, "schema_acceptance": 0.95}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def decode(engine: Engine, prompts: list[list[int]], c: int, params: SamplingParams) -> list:
    return [o for i in range(0, len(prompts), c)
            for o in engine.generate(prompts[i : i + c], params, provenance=True, response_format=FORMAT)]


def measure(engine: Engine, prompts: list[list[int]], c: int, params: SamplingParams, repeats: int) -> dict:
    decode(engine, prompts[:2], min(c, 2), params)  # warm-up: grammar compilation, first allocations
    walls, outs = [], None
    for _ in range(repeats):
        before = SpecStats().merge(engine.stats)
        start = time.perf_counter()
        outs = decode(engine, prompts, c, params)
        walls.append(time.perf_counter() - start)
        spec = engine.stats.since(before)
    tokens = sum(len(o.token_ids) for o in outs)
    rounds = sum(len(o.provenance) for o in outs)
    tally = Tally(max(engine.gamma, 1))
    for o in outs:
        tally.add(token_classes(engine.tokenizer, o.token_ids), o.provenance)
    counts = tally.summary()["class_counts"]
    kept = sum(counts.get(k, {}).get("accepted", 0) for k in SCHEMA_CLASSES)
    reached = kept + sum(counts.get(k, {}).get("rejected", 0) for k in SCHEMA_CLASSES)
    wall = statistics.median(walls)
    return {"wall_s": wall, "wall_s_repeats": walls, "output_tokens": tokens, "tokens_per_s": tokens / wall,
            "decode_rounds": rounds, "tokens_per_forward": (tokens - len(outs)) / rounds if rounds else None,
            "spec": spec.to_dict(), "schema_token_acceptance": kept / reached if reached else None,
            "token_ids": [o.token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--drafts", default="general=draft-general,domain=draft-domain",
                    help="name=directory pairs (directories relative to the fixture folder, or absolute)")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--concurrency", type=_ints, default=[1, 16], help="comma-separated, e.g. 1,16")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per point (the median is reported)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "schema_drafting.json")
    args = ap.parse_args()
    drafts = {k: FIXTURE / v if not Path(v).is_absolute() else Path(v)
              for k, v in (pair.split("=", 1) for pair in args.drafts.split(","))}

    console = Console(width=170)
    plain = Engine.load(args.model, max_batch=max(args.concurrency), device=args.device)
    prompts = [query_prompt_ids(plain.tokenizer, ex.query) for ex in heldout_examples(args.num_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    configs = [("plain", None, None), ("schema", None, "schema")]
    for name, path in drafts.items():
        configs += [(f"eagle3 {name}", path, "eagle3"), (f"schema+eagle3 {name}", path, "schema+eagle3")]
    started = time.perf_counter()
    points: dict[tuple[str, int], dict] = {}
    for label, draft, drafter in configs:
        engine = plain if drafter is None else Engine.load(args.model, draft, gamma=args.gamma, device=args.device,
                                                           max_batch=max(args.concurrency), drafter=drafter)
        for c in args.concurrency:
            points[(label, c)] = measure(engine, prompts, c, params, args.repeats)
            p = points[(label, c)]
            console.print(f"  {label} c={c}: {p['tokens_per_s']:.1f} tok/s, {p['tokens_per_forward'] or 1:.2f} "
                          "tokens/forward")
    rows = []
    for (label, c), p in points.items():
        base = points[("plain", c)]
        eagle = points.get((label.replace("schema+", ""), c)) if label.startswith("schema+") else None
        rows.append({
            "config": label, "concurrency": c, **{k: v for k, v in p.items() if k != "token_ids"},
            "outputs_equal_plain": sum(a == b for a, b in zip(p["token_ids"], base["token_ids"])),
            "tokens_per_s_vs_plain": p["tokens_per_s"] / base["tokens_per_s"],
            "tokens_per_s_vs_eagle3": p["tokens_per_s"] / eagle["tokens_per_s"] if eagle else None,
            "tokens_per_forward_vs_eagle3": p["tokens_per_forward"] / eagle["tokens_per_forward"] if eagle else None,
        })

    table = Table(title=f"commerce schema, greedy, γ = {args.gamma}, {len(prompts)} held-out queries",
                  caption="tok/forward = emitted tokens per target forward; MAL = vLLM's mean acceptance length; "
                          "schema acc. = acceptance on structure, quotes and keys; ×eagle3 = same draft without "
                          "the schema; same = outputs equal plain constrained decoding")
    for col in ("config", "conc", "tok/s", "×plain", "×eagle3 tok/s", "tok/forward", "×eagle3 tok/fwd", "MAL",
                "schema acc.", "same"):
        table.add_column(col, justify="right")
    fmt = lambda x, f="{:.2f}": "-" if x is None else f.format(x)  # noqa: E731
    for r in rows:
        spec = r["spec"] if r["spec"]["num_drafts"] else {}
        table.add_row(r["config"], str(r["concurrency"]), f"{r['tokens_per_s']:.1f}", fmt(r["tokens_per_s_vs_plain"]),
                      fmt(r["tokens_per_s_vs_eagle3"]), fmt(r["tokens_per_forward"]),
                      fmt(r["tokens_per_forward_vs_eagle3"]), fmt(spec.get("mean_acceptance_length")),
                      fmt(r["schema_token_acceptance"], "{:.3f}"), f"{r['outputs_equal_plain']}/{len(prompts)}")
    console.print(table)

    goals = []
    for name in drafts:
        ours = [r for r in rows if r["config"] == f"schema+eagle3 {name}"]
        need = GOALS.get(f"per_forward_{name}", GOALS["per_forward_domain"])
        for r in ours:
            goals.append({"goal": f"{name}: tokens per forward ≥ {need}× eagle3 (c={r['concurrency']})",
                          "value": r["tokens_per_forward_vs_eagle3"], "met": r["tokens_per_forward_vs_eagle3"] >= need})
            goals.append({"goal": f"{name}: output tok/s ≥ {GOALS['tokens_per_s']}× eagle3 (c={r['concurrency']})",
                          "value": r["tokens_per_s_vs_eagle3"], "met": r["tokens_per_s_vs_eagle3"] >= GOALS["tokens_per_s"]})
            goals.append({"goal": f"{name}: acceptance on structure + keys ≥ {GOALS['schema_acceptance']} "
                                  f"(c={r['concurrency']})",
                          "value": r["schema_token_acceptance"],
                          "met": (r["schema_token_acceptance"] or 0) >= GOALS["schema_acceptance"]})
    goals.append({"goal": "every output equals plain constrained decoding",
                  "value": min(r["outputs_equal_plain"] for r in rows) / len(prompts),
                  "met": all(r["outputs_equal_plain"] == len(prompts) for r in rows)})
    for g in goals:
        console.print(f"{'met' if g['met'] else '[red]missed[/red]'}: {g['goal']} ({g['value']:.3f})")

    doc = {
        "benchmark": "schema_drafting",
        "config": {"model": _shown(args.model), "drafts": {k: _shown(v) for k, v in drafts.items()},
                   "gamma": args.gamma, "num_prompts": len(prompts), "concurrency": args.concurrency,
                   "max_tokens": args.max_tokens, "repeats": args.repeats, "device": args.device},
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "rows": rows, "goals": goals, "elapsed_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
