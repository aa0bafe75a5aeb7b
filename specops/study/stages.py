"""The study's stages after the sweep: quality, acceptance, summary. Each stored result is final: a resumed study
skips every (stage, key) already in the store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from rich.console import Console

from specops.bench.store import RunStore

if TYPE_CHECKING:
    from specops.study.pipeline import StudyConfig


def outputs_by_prompt(store: RunStore, gamma: int, temperature: float) -> dict[str, str]:
    """The answer texts of one γ at one temperature, by prompt id: from the lowest concurrency measured (every
    request of a configuration is sent with the same seed at every concurrency, so any one would do), first repeat,
    completed requests only."""
    configs = [c for c in store.configs() if c.point.gamma == gamma and c.point.temperature == temperature]
    if not configs:
        return {}
    first = min(configs, key=lambda c: (c.point.concurrency, c.point.repeat))
    out: dict[str, str] = {}
    for r in first.records:
        if r.ok and r.prompt_id not in out:
            out[r.prompt_id] = r.text
    return out


def gold_by_prompt(cfg: "StudyConfig") -> dict[str, dict]:
    """Gold parameters by prompt id where the prompts carry them (synthetic queries always do)."""
    from specops.inputs import read_records
    from specops.task import synth

    if cfg.sweep.synthetic is not None:
        return {str(e.id): e.gold for e in synth.generate(cfg.sweep.synthetic, cfg.sweep.seed)}
    records, _ = read_records(Path(cfg.sweep.dataset), on_bad="skip")
    return {str(r["id"]): r["gold"] for r in records if isinstance(r.get("gold"), dict)}


def summary(run_dir: Path, store: RunStore) -> list[str]:
    """The headline findings, one sentence each, from what the run stored."""
    import json

    results = json.loads((Path(run_dir) / "results.json").read_text(encoding="utf-8"))
    rows = results["configurations"]
    lines = []
    for t in sorted({r["temperature"] for r in rows}):
        for g in sorted({r["gamma"] for r in rows if r["gamma"] > 0}):
            sp = [(r["concurrency"], (r.get("speedup_throughput") or {}).get("value")) for r in rows
                  if r["gamma"] == g and r["temperature"] == t]
            sp = [(c, v) for c, v in sorted(sp) if v is not None]
            if sp:
                lines.append(f"T = {t:g}, γ = {g}: throughput {', '.join(f'{v:.2f}× at concurrency {c}' for c, v in sp)}"
                             " of γ = 0" + ("" if all(v >= 1 for _, v in sp) else " (regressions below 1×)"))
    for key, q in store.results("quality").items():
        parts = []
        if q.get("lossless"):
            parts.append(f"{q['lossless']['identical_share']:.0%} identical outputs")
        diff = (q.get("accuracy") or {}).get("difference")
        if diff and diff.get("value") is not None:
            ci = (f" [{diff['ci95_low']:+.3f}, {diff['ci95_high']:+.3f}]" if diff.get("ci95_low") is not None else "")
            parts.append(f"field accuracy Δ {diff['value']:+.3f}{ci}")
        judge = q.get("judge") or {}
        if judge.get("win"):
            parts.append(f"judge win/tie/loss {judge['win']['value']:.0%}/{judge['tie']['value']:.0%}/"
                         f"{judge['loss']['value']:.0%}")
        if q.get("retrieval"):
            parts.append(f"retrieval overlap@k {q['retrieval']['overlap_at_k']:.3f}")
        lines.append(f"quality, {key} vs γ = 0: " + (", ".join(parts) or "nothing to compare"))
    acc = store.result("acceptance", "drafts") or {}
    for name, d in (acc.get("drafts") or {}).items():
        share = d.get("schema_rejection_share")
        lines.append(f"acceptance, {name}: rate {d['acceptance_rate']:.2f}, mean length {d['mean_acceptance_length']:.2f}"
                     + (f", {share:.0%} of rejections on schema tokens" if share is not None else ""))
    lines += [f"advice: {a}" for a in acc.get("advice", [])]
    rec_path = Path(run_dir) / "recommendation.json"
    if rec_path.is_file():
        rec = json.loads(rec_path.read_text(encoding="utf-8"))
        for block in rec["by_temperature"]:
            levels = ", ".join(f"γ = {lv['gamma']} at concurrency {lv['concurrency']}" for lv in block["levels"])
            lines.append(f"recommended at T = {block['temperature']:g}: {levels}; vLLM {block['vllm']['cli']}")
    return lines


def _queries_and_gold(cfg: "StudyConfig") -> tuple[dict[str, str], dict[str, dict]]:
    from specops.quality.compare import prompts_and_gold
    from specops.task import synth

    if cfg.sweep.synthetic is not None:
        examples = synth.generate(cfg.sweep.synthetic, cfg.sweep.seed)
        return {str(e.id): e.query for e in examples}, {str(e.id): e.gold for e in examples}
    return prompts_and_gold(Path(cfg.sweep.dataset))


def quality(cfg: "StudyConfig", store: RunStore, console: Optional[Console]) -> None:
    """Each γ > 0 against γ = 0 at each temperature; one stored result per pair, judgments cached."""
    from specops.fixtures.catalog import DEFAULT_PATH
    from specops.quality import compare
    from specops.quality.outputs import Answer

    queries, gold = _queries_and_gold(cfg)
    if cfg.judge == "reference":
        spec = compare.JudgeSpec("reference" if gold else "none")
    else:
        spec = compare.JudgeSpec("url", cfg.judge, cfg.judge_model, cfg.judge_api_key)
    done = store.results("quality")
    for t in cfg.sweep.temperatures:
        baseline = {i: Answer(x) for i, x in outputs_by_prompt(store, 0, t).items()}
        for g in (g for g in cfg.sweep.gammas if g > 0):
            key = f"γ = {g}, T = {t:g}"
            if key in done or not baseline:
                continue
            candidate = {i: Answer(x) for i, x in outputs_by_prompt(store, g, t).items()}
            if console:
                console.print(f"quality: {key} against γ = 0")
            store.put_result("quality", key, compare.run(baseline, candidate, queries, gold, spec, "both",
                                                         cfg.sweep.seed, DEFAULT_PATH, Path(cfg.sweep.out) / "judge.sqlite",
                                                         sampled=t > 0))


def acceptance(cfg: "StudyConfig", store: RunStore, console: Optional[Console]) -> None:
    """The draft (and the comparison draft) on the study's first prompts, greedy, at the largest γ of the grid;
    one stored result per draft, then the side-by-side summary with its advice."""
    from specops.analysis.advice import advise
    from specops.analysis.measure import draft_names, measure
    from specops.engine.config import EngineConfig
    from specops.engine.sampling import SamplingParams
    from specops.files import read_json
    from specops.inputs import query_prompt_ids, read_records, record_prompt_ids
    from specops.models.target import load_tokenizer
    from specops.task import synth

    if cfg.sweep.model is None or cfg.sweep.draft is None:
        return  # an external server: no model to run here
    drafts = [Path(cfg.sweep.draft)] + ([Path(cfg.compare_draft)] if cfg.compare_draft else [])
    model = Path(cfg.sweep.model)
    tok = load_tokenizer(model, read_json(model / "config.json")["vocab_size"])
    n = cfg.acceptance_prompts
    if cfg.sweep.synthetic is not None:
        prompts = [query_prompt_ids(tok, e.query) for e in synth.generate(cfg.sweep.synthetic, cfg.sweep.seed)[:n]]
    else:
        records, _ = read_records(Path(cfg.sweep.dataset), on_bad="skip")
        prompts = [record_prompt_ids(tok, r) for r in records[:n]]
    engine_cfg = EngineConfig(model=model, lora=cfg.sweep.lora, gamma=max(cfg.sweep.gammas), device=cfg.device,
                              max_batch=16)
    params = SamplingParams(temperature=0.0, max_tokens=cfg.sweep.max_tokens)
    stored = store.results("acceptance")
    for name, d in zip(draft_names(drafts), drafts):
        if name in stored:
            continue
        if console:
            console.print(f"acceptance: {name} on {len(prompts)} prompts")
        store.put_result("acceptance", name, measure(engine_cfg, [d], prompts, params)["drafts"][name])
    per_draft = {name: store.result("acceptance", name) for name in draft_names(drafts)}
    store.put_result("acceptance", "drafts", {"drafts": per_draft, "advice": advise(per_draft)})
