"""`specops generate`: a JSONL file of requests in, a JSONL file of completions out, through the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specops.errors import SpecopsError
from specops.inputs import record_prompt_ids

CHUNK = 64  # requests per engine call: results reach the output file as each chunk finishes


def read_requests(path: Path) -> list[dict[str, Any]]:
    """Input records with an ``id``; malformed lines are an error naming the line."""
    if not path.is_file():
        raise SpecopsError(f"prompts file not found: {path}")
    records = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecopsError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise SpecopsError(f"{path}:{lineno}: each line must be a JSON object")
            rec.setdefault("id", str(lineno))
            records.append(rec)
    if not records:
        raise SpecopsError(f"{path}: no requests in the file")
    return records


def run(
    *,
    model: Path,
    prompts: Path,
    out: Path,
    lora: Path | None = None,
    lora_mode: str = "merged",
    draft: Path | None = None,
    gamma: int = 3,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_tokens: int = 256,
    seed: int = 0,
    device: str = "cpu",
    max_batch: int = 16,
) -> dict[str, Any]:
    """Generate for every request in ``prompts``; returns the engine's total statistics."""
    from rich.progress import Progress

    from specops.engine import Engine, SamplingParams

    records = read_requests(prompts)
    if max_tokens < 1:
        raise SpecopsError("--max-tokens must be at least 1")
    engine = Engine.load(model, lora=lora, lora_mode=lora_mode, draft=draft, gamma=gamma if draft else 0,
                         device=device, max_batch=max_batch)
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
            for rec, o in zip(batch, engine.generate(ids[start : start + CHUNK], params)):
                line = {"id": rec["id"], "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason}
                if draft is not None:
                    line["spec"] = o.spec.to_dict()
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
            f.flush()
            bar.advance(task, len(batch))
    return engine.stats.to_dict()
