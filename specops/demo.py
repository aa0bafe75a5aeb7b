"""`specops demo`: the study in miniature, on the bundled fixtures.

Held-out shopper queries (never trained on) go through the embedded server as in production: plain decoding and
EAGLE-3 with the domain-tuned draft, at concurrency 1 and 4, greedy and at temperature 0.7; then the quality of
γ = 3 against γ = 0 with the offline reference judge, the acceptance analysis of the domain draft next to the
general one (the stand-in for a published draft that never saw the fine-tuned target), the recommendation, and
``runs/demo/report.html``. A second run re-uses what the first measured (it resumes); ``--fresh`` starts over.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from specops.errors import SpecopsError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny"
DEMO_SEED = 9001  # disjoint from the seeds the fixture recipe trains on


def run(out_dir: Path = Path("runs/demo"), num_queries: int = 24, gamma: int = 3, fresh: bool = False) -> Path:
    from specops.bench.config import SweepConfig
    from specops.study.pipeline import StudyConfig, run_study
    from specops.task import synth

    target = FIXTURES / "target-merged"
    for d in (target, FIXTURES / "draft-domain", FIXTURES / "draft-general"):
        if not d.is_dir():
            raise SpecopsError(f"fixture model not found at {d}; build the fixtures with `specops fixtures build`")
    out_dir = Path(out_dir)
    if fresh:
        shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    queries = out_dir / "queries.jsonl"
    synth.write_examples(synth.generate(num_queries, seed=DEMO_SEED), queries)
    sweep = SweepConfig(out=out_dir, backend="embedded", model=target, draft=FIXTURES / "draft-domain",
                        gammas=[0, gamma], concurrencies=[1, 4], temperatures=[0.0, 0.7], dataset=queries,
                        num_prompts=num_queries, max_tokens=192, warmup=2, resume=True)
    cfg = StudyConfig(sweep=sweep, compare_draft=FIXTURES / "draft-general", judge="reference",
                      acceptance_prompts=num_queries, title="specops demo: commerce-tiny, domain draft vs plain")
    return run_study(cfg)
