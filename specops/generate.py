"""`specops generate`: a JSONL file of requests in, a JSONL file of completions out, through the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specops.engine.config import EngineConfig
from specops.errors import SpecopsError
from specops.inputs import read_records, record_prompt_ids, schema_format

CHUNK = 64  # requests per engine call: results reach the output file as each chunk finishes


def run(
    cfg: EngineConfig,
    *,
    prompts: Path,
    out: Path,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_tokens: int = 256,
    seed: int = 0,
    provenance: bool = False,
    json_schema: Path | None = None,
) -> dict[str, Any]:
    """Generate for every request in ``prompts`` with the engine ``cfg`` names, every output constrained to
    ``json_schema`` when given; returns the engine's total statistics."""
    from rich.progress import Progress

    from specops.engine.engine import Engine
    from specops.engine.sampling import SamplingParams

    records, _ = read_records(prompts)
    if max_tokens < 1:
        raise SpecopsError("--max-tokens must be at least 1")
    if cfg.forced_tokens and json_schema is None:
        raise SpecopsError(f"--drafter {cfg.drafter} drafts the tokens a schema forces: give --json-schema FILE")
    response_format = schema_format(json_schema) if json_schema is not None else None
    engine = Engine.from_config(cfg)
    if response_format is not None:
        engine.constraint(response_format)  # compile it now: a bad schema fails before any decoding
    ids = []
    for i, rec in enumerate(records, 1):
        try:
            ids.append(record_prompt_ids(engine.tokenizer, rec))
        except SpecopsError as e:
            raise SpecopsError(f"{prompts}: request {rec['id']!r} (record {i}): {e}") from None
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f, Progress(transient=True) as bar:
        task = bar.add_task("generating", total=len(records))
        for start in range(0, len(records), CHUNK):
            batch = records[start : start + CHUNK]
            outputs = engine.generate(ids[start : start + CHUNK], params, provenance=provenance,
                                      response_format=response_format)
            for rec, o in zip(batch, outputs):
                line = {"id": rec["id"], "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason}
                if engine.speculative:
                    line["spec"] = o.spec.to_dict()
                if provenance:
                    line["provenance"] = o.provenance
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
            f.flush()
            bar.advance(task, len(batch))
    return engine.stats.to_dict()

