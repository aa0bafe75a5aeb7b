"""Measure acceptance by class for one or more drafts: decode the prompts with the embedded engine and each draft
(provenance on), or read the provenance a sweep recorded; classify; aggregate; check against the counters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from specops.analysis.acceptance import Tally
from specops.analysis.advice import advise
from specops.analysis.alignment import token_classes
from specops.engine.config import EngineConfig
from specops.engine.sampling import SamplingParams
from specops.errors import SpecopsError

Progress = Callable[[str, int, int], None]  # (draft, done, total)


def draft_names(drafts: list[Path]) -> list[str]:
    """Directory names, or the whole paths where two drafts share a name."""
    names = [Path(d).name for d in drafts]
    return names if len(set(names)) == len(names) else [str(d) for d in drafts]


def decode(engine, prompts: list[list[int]], params: SamplingParams, response_format: Optional[dict],
           progress: Optional[Callable[[int], None]] = None) -> list:
    """Outputs (with provenance) of every prompt, each under the grammar of ``response_format`` when given."""
    grammars = None
    if response_format is not None:
        from specops.engine.grammar import Grammars

        grammars = Grammars(engine.tokenizer, engine.vocab_size)
    ids = [f"a{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        c = grammars.constraint(response_format, engine.eos_token_ids) if grammars is not None else None
        engine.add_request(rid, p, params, constraint=c, provenance=True)
    done: dict[str, object] = {}
    while engine.has_unfinished():
        for so in engine.step():
            if so.finished:
                done[so.request_id] = so.output
                if progress:
                    progress(len(done))
    return [done[r] for r in ids]


def measure(cfg: EngineConfig, drafts: list[Path], prompts: list[list[int]], params: SamplingParams,
            response_format: Optional[dict] = None, progress: Optional[Progress] = None) -> dict:
    """Per draft: the acceptance summary, and the engine's own counters it must equal."""
    from specops.engine.engine import Engine

    out = {}
    for name, d in zip(draft_names(drafts), drafts):
        engine = Engine.from_config(replace(cfg, draft=Path(d)))
        if not engine.speculative:
            raise SpecopsError("acceptance needs γ ≥ 1")
        outs = decode(engine, prompts, params, response_format,
                      None if progress is None else (lambda n, name=name: progress(name, n, len(prompts))))
        tally = Tally(engine.gamma)
        for o in outs:
            tally.add(token_classes(engine.tokenizer, o.token_ids), o.provenance)
        summary = tally.summary()
        summary["engine_counters"] = engine.stats.to_dict()
        summary["matches_engine"] = (tally.num_accepted == engine.stats.num_accepted_tokens
                                     and tally.rounds == engine.stats.num_drafts
                                     and tally.draft_tokens == engine.stats.num_draft_tokens
                                     and tally.accepted_per_pos[: len(engine.stats.accepted_per_pos)]
                                     == engine.stats.accepted_per_pos)
        out[name] = summary
        del engine
    return {"drafts": out, "advice": advise(out)}


def from_run(run_dir: Path, tokenizer, gamma: Optional[int] = None, temperature: float = 0.0) -> dict:
    """The acceptance summary of a sweep's recorded provenance (``specops sweep --provenance``): the configuration
    of γ (default: the largest) at ``temperature`` and the lowest concurrency."""
    from specops.bench.store import DB_NAME, RunStore

    if not (Path(run_dir) / DB_NAME).is_file():
        raise SpecopsError(f"{run_dir}: not a run directory (no {DB_NAME})")
    store = RunStore(run_dir)
    try:
        configs = [c for c in store.configs() if c.point.gamma > 0 and c.point.temperature == temperature]
    finally:
        store.close()
    if gamma is not None:
        configs = [c for c in configs if c.point.gamma == gamma]
    if not configs:
        raise SpecopsError(f"{run_dir}: no speculative configuration at temperature {temperature:g}"
                           + (f" with γ = {gamma}" if gamma is not None else ""))
    chosen = min(configs, key=lambda c: (-c.point.gamma, c.point.concurrency, c.point.repeat))
    recorded = [r.provenance for r in chosen.records if r.ok and r.provenance]
    if not recorded:
        raise SpecopsError(f"{run_dir}: the sweep recorded no provenance (run it with --provenance)")
    tally = Tally(chosen.point.gamma)
    for prov in recorded:
        tally.add(token_classes(tokenizer, prov["token_ids"]), prov["rounds"])
    summary = tally.summary()
    counters = chosen.spec or {}
    summary["server_counters"] = counters
    summary["matches_server"] = (len(recorded) == len(chosen.records)
                                 and counters.get("num_accepted_tokens") == tally.num_accepted)
    drafts = {f"γ = {chosen.point.gamma}, concurrency {chosen.point.concurrency}": summary}
    return {"drafts": drafts, "advice": advise(drafts)}
