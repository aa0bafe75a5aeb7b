"""``specops study``: the source study's questions answered for one model, in one resumable run.

Stages, in order, each keeping what it finishes in the run's SQLite store (``runs.sqlite``):

1. sweep: the γ × concurrency × temperature grid through a real server (``bench.sweep``), every configuration
   committed with its request records as it finishes;
2. quality: each γ > 0 against γ = 0 on the same prompts, seeds and temperature (``quality``), one stored result
   per (γ, temperature); the judge's verdicts are cached in ``judge.sqlite`` beside it;
3. acceptance: why the draft's acceptance is what it is, for the draft and the comparison draft (``analysis``);
4. the summary and ``report.html``.

``--resume`` after an interruption anywhere continues with what is missing: no configuration, judgment or
acceptance figure is measured twice. The study's own settings (comparison draft, judge) are fixed for a run, as
the sweep's are.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from rich.console import Console

from specops.bench.config import SweepConfig
from specops.bench.store import RunStore
from specops.bench.sweep import run_sweep
from specops.errors import SpecopsError


@dataclass
class StudyConfig:
    sweep: SweepConfig  # the grid, the prompts, the server, and the run directory (sweep.out)
    compare_draft: Optional[Path] = None  # a second draft for the acceptance analysis (e.g. a general one)
    judge: str = "reference"  # "reference" (offline, deterministic) or the URL of an OpenAI-compatible server
    judge_model: Optional[str] = None
    judge_api_key: Optional[str] = None
    acceptance_prompts: int = 32
    title: Optional[str] = None
    device: str = "cpu"  # where the acceptance analysis runs the engine

    def validate(self) -> None:
        self.sweep.validate()
        if self.compare_draft is not None and not Path(self.compare_draft).is_dir():
            raise SpecopsError(f"--compare-draft: directory not found: {self.compare_draft}")
        if self.judge != "reference" and not self.judge_model:
            raise SpecopsError("a judge URL needs --judge-model (the model name the judge server serves)")
        if self.acceptance_prompts < 1:
            raise SpecopsError("--acceptance-prompts must be at least 1")
        if max(self.sweep.gammas) == 0:
            raise SpecopsError("a study compares speculation with plain decoding: give --gamma with 0 and a γ > 0")

    def fixed(self) -> dict:
        """The study's settings a resume must share (the sweep keeps its own)."""
        return {"compare_draft": str(Path(self.compare_draft).resolve()) if self.compare_draft else None,
                "judge": self.judge, "judge_model": self.judge_model, "acceptance_prompts": self.acceptance_prompts}


def run_study(cfg: StudyConfig, console: Optional[Console] = None, tables: Optional[Console] = None) -> Path:
    """Run (or continue) every stage; returns the path of the report."""
    from specops.report.html import write as write_report
    from specops.study import environment, stages

    console = console or Console(stderr=True)
    tables = tables or Console(width=None if sys.stdout.isatty() else 200)
    cfg.validate()
    out = Path(cfg.sweep.out)
    _check_resume(out, cfg)
    console.rule("sweep")
    _mark(out, "sweep")
    run_sweep(cfg.sweep, console=console, tables=tables)
    store = RunStore(out)
    try:
        store.put_meta("study", {"fixed": cfg.fixed(), "title": cfg.title,
                                 "config": {k: str(v) if isinstance(v, Path) else v
                                            for k, v in asdict(cfg).items() if k != "sweep" and k != "judge_api_key"}})
        store.put_meta("environment", environment.describe())
        for name, stage in (("quality", stages.quality), ("acceptance", stages.acceptance)):
            console.rule(name)
            store.put_meta("stage", name)
            stage(cfg, store, console)
        store.put_meta("stage", "report")
        lines = stages.summary(out, store)
        store.put_result("summary", "lines", lines)
    finally:
        store.close()
    for line in lines:
        tables.print(line)
    return write_report(out)


def _mark(out: Path, stage: str) -> None:
    """Record the stage now running (what a progress watcher, or a test, reads)."""
    store = RunStore(out)
    try:
        store.put_meta("stage", stage)
    finally:
        store.close()


def _check_resume(out: Path, cfg: StudyConfig) -> None:
    """A run directory that holds a study with other settings is refused; one without ``--resume`` too."""
    from specops.bench.store import DB_NAME

    if not (out / DB_NAME).is_file():
        return
    store = RunStore(out)
    try:
        study = store.meta("study")
        measured = bool(store.done_keys())
    finally:
        store.close()
    if measured and not cfg.sweep.resume:
        raise SpecopsError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    if study is not None and study["fixed"] != cfg.fixed():
        diff = [f"{k}: {study['fixed'].get(k)!r} in the run, {v!r} now" for k, v in cfg.fixed().items()
                if study["fixed"].get(k) != v]
        raise SpecopsError(f"cannot resume {out} with different study settings ({'; '.join(diff)})")
