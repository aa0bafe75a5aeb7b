"""`specops fixtures build`: train the fixture models (base, LoRA adapter, merged target) from generated data."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(help="Fixture models trained from the project's own synthetic data.", no_args_is_help=True)


@app.command()
def build(
    out: Path = typer.Option(Path("fixtures/commerce-tiny"), "--out", help="Directory for base/, lora/, target-merged/."),
    quick: bool = typer.Option(False, "--quick", help="Scaled-down budget (seconds, not minutes); same shapes."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data, the initialisation and the batch order."),
) -> None:
    """Pretrain the base, fine-tune the LoRA adapter on the commerce task, merge, measure, write."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specops.models import fixtures

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn()) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, step: int, total: int, loss: float) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total, loss=float("nan"))
            bar.update(tasks[stage], completed=step, loss=loss)

        summary = fixtures.build(out, quick=quick, seed=seed, progress=progress)
    typer.echo(json.dumps(summary, indent=2))
