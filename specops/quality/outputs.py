"""The two answer sets a quality comparison reads: ``specops generate`` JSONL files, or one configuration of a
sweep's run directory (``RUN_DIR:gamma=3,temperature=0``; the lowest concurrency measured, first repeat)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specops.errors import SpecopsError
from specops.files import read_jsonl


@dataclass(frozen=True)
class Answer:
    text: str
    token_ids: Optional[tuple[int, ...]] = None  # a run directory records text only


def load(spec: str) -> dict[str, Answer]:
    """Answers by id."""
    path, _, selector = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    if Path(path).is_dir():
        return _from_run(Path(path), selector)
    rows, _ = read_jsonl(path)
    out: dict[str, Answer] = {}
    for lineno, rec in rows:
        if "id" not in rec or not isinstance(rec.get("text"), str):
            raise SpecopsError(f'{path}:{lineno}: expected an object with "id" and "text" (specops generate output)')
        ids = rec.get("token_ids")
        out[str(rec["id"])] = Answer(rec["text"], tuple(ids) if isinstance(ids, list) else None)
    if not out:
        raise SpecopsError(f"{path}: no answers")
    return out


def _from_run(run_dir: Path, selector: str) -> dict[str, Answer]:
    from specops.bench.store import DB_NAME, RunStore

    if not (run_dir / DB_NAME).is_file():
        raise SpecopsError(f"{run_dir}: not a run directory (no {DB_NAME})")
    want: dict[str, float] = {}
    for part in filter(None, selector.split(",")):
        key, _, value = part.partition("=")
        if key not in ("gamma", "temperature") or not value:
            raise SpecopsError(f"{run_dir}: selector {selector!r}: use gamma=G,temperature=T")
        want[key] = float(value)
    store = RunStore(run_dir)
    try:
        configs = [c for c in store.configs()
                   if c.point.gamma == want.get("gamma", c.point.gamma)
                   and c.point.temperature == want.get("temperature", c.point.temperature)]
    finally:
        store.close()
    if not configs:
        raise SpecopsError(f"{run_dir}: no configuration matches {selector or '(none)'}")
    if len({(c.point.gamma, c.point.temperature) for c in configs}) > 1:
        raise SpecopsError(f"{run_dir}: several configurations match; select one with :gamma=G,temperature=T")
    first = min(configs, key=lambda c: (c.point.concurrency, c.point.repeat))
    out: dict[str, Answer] = {}
    for r in first.records:
        if r.ok and r.prompt_id not in out:
            out[r.prompt_id] = Answer(r.text)
    return out
