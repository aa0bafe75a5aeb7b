"""`specops train-draft`: fine-tune an EAGLE-3 draft on the target's own answers to domain prompts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specops.errors import SpecopsError, clean_errors

app = typer.Typer(help="Train EAGLE-3 drafts on self-distilled data.")


def _bar():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn())


@app.command("train-draft")
@clean_errors(interrupted="interrupted; rerun the same command to resume")
def train_draft(
    target: Path = typer.Option(..., "--target", help="Target model directory (Hugging Face layout)."),
    out: Path = typer.Option(..., "--out", help="Draft directory to write (vLLM EAGLE-3 layout)."),
    lora: Optional[Path] = typer.Option(None, "--lora", help="peft LoRA adapter the target serves with."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help='JSONL, one {"query"|"prompt"|"messages"} per line.'),
    synthetic: Optional[int] = typer.Option(None, "--synthetic", min=1, help="Use N synthetic commerce queries."),
    init: Optional[Path] = typer.Option(None, "--init", help="Draft to fine-tune (else a fresh one)."),
    ttt_steps: int = typer.Option(3, "--ttt-steps", min=1, help="Training-time-test unroll length."),
    draft_vocab_size: Optional[int] = typer.Option(None, "--draft-vocab-size", min=1,
                                                   help="Draft vocabulary (default: the --init draft's, else 32000)."),
    epochs: float = typer.Option(1.0, "--epochs", min=0.01),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    online: bool = typer.Option(False, "--online", help="Compute target features per batch instead of caching them."),
    seed: int = typer.Option(0, "--seed"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="Regeneration temperature (0 = greedy)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, help="Answer length cap when regenerating."),
    eval_prompts: int = typer.Option(32, "--eval-prompts", min=0, help="Prompts held out to measure acceptance."),
    batch_size: int = typer.Option(16, "--batch-size", min=1),
    lr: float = typer.Option(2e-3, "--lr", min=0.0, help="Peak learning rate (warm-up, then cosine decay)."),
    checkpoint_every: int = typer.Option(50, "--checkpoint-every", min=1, help="Steps between resumable checkpoints."),
) -> None:
    """Regenerate answers with the target, cache its hidden states, train the draft with TTT, measure, write.

    Interrupted runs resume: rerun the same command.
    """
    from specops.training import pipeline
    from specops.training.train import TrainConfig

    if (prompts is None) == (synthetic is None):
        raise SpecopsError("give exactly one of --prompts FILE.jsonl or --synthetic N")
    if device not in ("cpu", "cuda"):
        raise SpecopsError("--device must be cpu or cuda")
    source = pipeline.Source("file", str(prompts)) if prompts is not None else pipeline.Source("synthetic", synthetic)
    job = pipeline.Job(
        target=target, out=out, source=source, lora=lora, init=init, draft_vocab_size=draft_vocab_size,
        online=online, device=device, temperature=temperature, max_new_tokens=max_new_tokens,
        eval_prompts=eval_prompts,
        train=TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, ttt_steps=ttt_steps,
                          checkpoint_every=checkpoint_every, seed=seed),
    )
    with _bar() as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int, fields: dict) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total, info="")
            info = ""
            if "loss" in fields:
                info = f"loss {fields['loss']:.3f}  acc " + " ".join(f"{a:.2f}" for a in fields["acc"])
            bar.update(tasks[stage], completed=done, total=total, info=info)

        report = pipeline.run(job, progress)
    if report["prompts"]["skipped_lines"]:
        typer.secho(f"skipped {report['prompts']['skipped_lines']} unusable prompt line(s)", fg="yellow", err=True)
    typer.echo(json.dumps(report["acceptance"], indent=2))
    typer.echo(f"wrote {out}", err=True)
