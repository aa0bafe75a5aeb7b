"""``specops quality``: is anything lost going from a baseline to a candidate? Each part is computed when its
inputs exist, and written as one key of ``quality.json``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specops.errors import SpecopsError
from specops.quality import accuracy, judge, lossless, retrieval
from specops.quality.outputs import Answer


@dataclass(frozen=True)
class JudgeSpec:
    kind: str = "reference"  # "reference", "url" or "none"
    url: Optional[str] = None
    model: Optional[str] = None
    api_key: Optional[str] = None
    concurrency: int = 8
    timeout_s: float = 60.0


def prompts_and_gold(dataset: Optional[Path]) -> tuple[dict[str, str], dict[str, dict]]:
    """The query text (what the judge reads) and the gold parameters, by id, of a dataset of request records."""
    from specops.inputs import parse_input, read_records

    if dataset is None:
        return {}, {}
    records, _ = read_records(dataset, on_bad="skip")
    queries, gold = {}, {}
    for r in records:
        inp = parse_input(r)
        if inp.kind == "messages":
            queries[str(r["id"])] = next((m["content"] for m in reversed(inp.value) if m["role"] == "user"), "")
        else:
            queries[str(r["id"])] = inp.value
        if isinstance(r.get("gold"), dict):
            gold[str(r["id"])] = r["gold"]
    return queries, gold


def run(baseline: dict[str, Answer], candidate: dict[str, Answer], queries: dict[str, str], gold: dict[str, dict],
        judge_spec: JudgeSpec, order: str, seed: int, catalog: Optional[Path], cache_path: Path,
        sampled: bool = False, progress: Optional[Callable[[int, int], None]] = None) -> dict:
    ids = sorted(baseline.keys() & candidate.keys())
    if not ids:
        raise SpecopsError("the baseline and the candidate share no ids")
    result: dict = {"ids": {"baseline": len(baseline), "candidate": len(candidate), "shared": len(ids)}}
    result["lossless"] = lossless.compare(baseline, candidate)
    if sampled:
        result["field_distributions"] = lossless.field_distributions(baseline, candidate)
    if gold:
        result["accuracy"] = accuracy.compare(baseline, candidate, gold, seed)
    if judge_spec.kind != "none":
        if judge_spec.kind == "reference":
            if not gold:
                raise SpecopsError("--judge reference needs gold parameters (--dataset with a 'gold' per record)")
            impl = judge.ReferenceJudge(gold)
            pairs_ids = [i for i in ids if i in gold]
        else:
            if not queries:
                raise SpecopsError("a judge needs the queries: give --dataset")
            impl = judge.HttpJudge(judge_spec.url, judge_spec.model, judge.Cache(cache_path), judge_spec.api_key,
                                   judge_spec.concurrency, judge_spec.timeout_s)
            pairs_ids = [i for i in ids if i in queries]
        pairs = [(i, queries.get(i, ""), baseline[i].text, candidate[i].text) for i in pairs_ids]
        http = isinstance(impl, judge.HttpJudge)
        try:
            verdicts = judge.judge(pairs, impl, order, seed, progress)
        finally:
            if http:
                impl.cache.close()
        result["judge"] = {"judge": judge_spec.model if http else "reference", **verdicts,
                           **({"requests": impl.requests} if http else {})}
    if catalog is not None:
        result["retrieval"] = retrieval.compare(baseline, candidate, catalog)
    return result
