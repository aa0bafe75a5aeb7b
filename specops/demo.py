"""`specops demo`: the main job end to end on the bundled fixtures.

Held-out shopper queries go through the LoRA target three ways: plain decoding, with the general EAGLE-3 draft
(the stand-in for a published draft that never saw the fine-tuned target) and with the domain-tuned draft. The
demo checks that speculation changed no output token (greedy is lossless), scores the answers against the task
contract, and reports acceptance and the measured speed ratio: the study's finding in miniature.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specops.errors import SpecopsError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny"
DEMO_SEED = 9001  # disjoint from the seeds the fixture recipe trains on


def _decode(engine, prompts, max_tokens):
    from specops.engine.sampling import SamplingParams

    engine.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    t0 = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return outs, time.perf_counter() - t0


def run(out_dir: Path = Path("runs/demo"), num_queries: int = 32, gamma: int = 3, max_tokens: int = 256,
        max_batch: int = 8, console: Console | None = None) -> dict:
    from specops.engine.engine import Engine
    from specops.inputs import query_prompt_ids
    from specops.task import scoring, synth

    console = console or Console()
    target = FIXTURES / "target-merged"
    if not target.is_dir():
        raise SpecopsError(f"fixture target not found at {target}; build it with `specops fixtures build`")
    drafts = [FIXTURES / d for d in ("draft-general", "draft-domain") if (FIXTURES / d).is_dir()]

    examples = synth.generate(num_queries, seed=DEMO_SEED)
    console.print(f"[bold]specops demo[/]: {num_queries} held-out shopper queries (en + zh-TW) → {target.name}")
    runs = {}
    configs = [("plain γ=0", None, 0)] + [(f"{d.name.removeprefix('draft-')} γ={gamma}", d, gamma) for d in drafts]
    for label, d, g in configs:
        engine = Engine.load(target, draft=d, gamma=g, max_batch=max_batch)
        prompts = [query_prompt_ids(engine.tokenizer, ex.query) for ex in examples]
        with console.status(f"decoding: {label}"):
            outs, secs = _decode(engine, prompts, max_tokens)
        report = scoring.score([o.text for o in outs], [ex.gold for ex in examples])
        tokens = sum(len(o.token_ids) for o in outs)
        runs[label] = {"outs": outs, "seconds": secs, "tokens": tokens, "report": report,
                       "spec": engine.stats.to_dict() if d else None}

    base = runs[configs[0][0]]
    table = Table(title="Speed, quality and acceptance (greedy)")
    for col in ("config", "tok/s", "speedup", "valid", "field acc", "exact", "accept", "mean len"):
        table.add_column(col, justify="right" if col != "config" else "left")
    summary = {"num_queries": num_queries, "target": str(target), "drafts": [str(d) for d in drafts], "runs": {}}
    for label, r in runs.items():
        tps = r["tokens"] / r["seconds"]
        speedup = tps / (base["tokens"] / base["seconds"])
        rep, spec = r["report"], r["spec"]
        table.add_row(label, f"{tps:.1f}", f"{speedup:.2f}×", f"{rep.valid_rate:.1%}", f"{rep.field_accuracy:.1%}",
                      f"{rep.exact_match:.1%}", f"{spec['acceptance_rate']:.1%}" if spec else "–",
                      f"{spec['mean_acceptance_length']:.2f}" if spec else "–")
        summary["runs"][label] = {"tokens_per_s": tps, "speedup": speedup, "task": rep.to_dict(), "spec": spec,
                                  "seconds": r["seconds"], "output_tokens": r["tokens"]}
    console.print(table)
    summary["lossless_identical"] = {}
    for label, _, _ in configs[1:]:
        same = sum(a.token_ids == b.token_ids for a, b in zip(base["outs"], runs[label]["outs"]))
        summary["lossless_identical"][label] = same
        colour = "green" if same == num_queries else "red"
        console.print(f"[{colour}]lossless check, {label}: {same}/{num_queries} outputs identical to plain decoding[/]")
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "outputs.jsonl").open("w", encoding="utf-8") as f:
        for label, r in runs.items():
            for ex, o in zip(examples, r["outs"]):
                f.write(json.dumps({"config": label, "id": ex.id, "query": ex.query, "text": o.text,
                                    "finish_reason": o.finish_reason}, ensure_ascii=False) + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    console.print(f"wrote {out_dir}/summary.json and outputs.jsonl")
    return summary
