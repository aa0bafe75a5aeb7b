"""`specops study` (the whole pipeline for one model) and `specops report` (its HTML report, rebuilt from a run)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specops.bench import cli as bench
from specops.errors import clean_errors


@clean_errors(interrupted="interrupted; rerun the same command with --resume to continue")
def study(
    out: Path = typer.Option(..., "--out", help="Run directory: the store, results, recommendation and report.html."),
    model: Optional[Path] = bench.MODEL, lora: Optional[Path] = bench.LORA,
    draft: Optional[Path] = typer.Option(None, "--draft", help="EAGLE-3 draft to study (needed for γ > 0)."),
    compare_draft: Optional[Path] = typer.Option(None, "--compare-draft",
                                                 help="A second draft for the acceptance analysis (e.g. a general one)."),
    backend: str = bench.BACKEND, url: Optional[str] = bench.URL, api_key: Optional[str] = bench.API_KEY,
    vllm_python: Optional[Path] = bench.VLLM_PYTHON, vllm_arg: list[str] = bench.VLLM_ARG,
    gamma: str = typer.Option("0,1,3,5", "--gamma", help="Speculative tokens per step; 0 = no draft."),
    concurrency: str = typer.Option("1,4,16,32,64", "--concurrency", help="Clients (closed loop) or in-flight cap."),
    temperature: str = typer.Option("0,0.7", "--temperature", help="Sampling temperatures."),
    repeats: int = typer.Option(1, "--repeats", help="Measurements per configuration (≥ 2 gives speedup CIs)."),
    rate: Optional[str] = bench.RATE, dataset: Optional[Path] = bench.DATASET, synthetic: Optional[int] = bench.SYNTHETIC,
    num_prompts: int = bench.NUM_PROMPTS, waves: int = bench.WAVES, max_tokens: int = bench.MAX_TOKENS,
    warmup: int = bench.WARMUP,
    seed: int = bench.SEED, ignore_eos: bool = bench.IGNORE_EOS, slo: str = bench.SLO,
    judge: str = typer.Option("reference", "--judge",
                              help="reference (offline: prefers the answer closer to the gold parameters) or the "
                                   "URL of an OpenAI-compatible chat server to judge pairwise."),
    judge_model: Optional[str] = typer.Option(None, "--judge-model", help="Model name the judge server serves."),
    judge_api_key: Optional[str] = typer.Option(None, "--judge-api-key", help="Bearer key of the judge server."),
    acceptance_prompts: int = typer.Option(32, "--acceptance-prompts", help="Prompts for the acceptance analysis."),
    title: Optional[str] = typer.Option(None, "--title", help="Report title."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out: nothing finished is redone."),
    gpu_hourly_cost: Optional[float] = bench.COST, gpus: int = bench.GPUS, max_batch: Optional[int] = bench.MAX_BATCH,
) -> None:
    """The study for one model: the γ × concurrency × temperature sweep, quality of every γ > 0 against γ = 0,
    why the draft's acceptance is what it is, the recommendation, and RUN/report.html. Resumable."""
    from specops.study.pipeline import StudyConfig, run_study

    kw = dict(locals())
    sweep_cfg = bench.sweep_config(**kw)
    cfg = StudyConfig(sweep=sweep_cfg, compare_draft=compare_draft, judge=judge, judge_model=judge_model,
                      judge_api_key=judge_api_key, acceptance_prompts=acceptance_prompts, title=title)
    path = run_study(cfg)
    typer.echo(f"report: {path}")


@clean_errors
def report(run: Path = typer.Argument(..., help="A study's run directory.")) -> None:
    """Write RUN/report.html from what the run stored (no measurement): one self-contained file."""
    from specops.report.html import write

    typer.echo(f"wrote {write(run)}")
