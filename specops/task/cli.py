"""`task` commands: write synthetic data, score predictions against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specops.errors import SpecopsError, clean_errors
from specops.files import read_jsonl

app = typer.Typer(help="The commerce task: synthetic data and task metrics.", no_args_is_help=True,
                  pretty_exceptions_enable=False)



@app.command()
@clean_errors
def synth(
    n: int = typer.Option(1000, "--n", min=1, help="Number of examples."),
    seed: int = typer.Option(0, "--seed", help="Seed; examples depend only on (seed, index, languages)."),
    lang: str = typer.Option("en,zh-TW", "--lang", help="Comma-separated languages: en, zh-TW."),
    out: Path = typer.Option(..., "--out", help='JSONL output: {"id", "lang", "query", "gold"} per line.'),
) -> None:
    """Write synthetic shopping queries with gold search parameters."""
    from specops.task import synth as gen

    langs = tuple(x.strip() for x in lang.split(",") if x.strip())
    examples = gen.generate(n, seed=seed, langs=langs)
    try:
        gen.write_examples(examples, out)
    except OSError as e:
        raise SpecopsError(f"cannot write {out}: {e}") from None
    typer.echo(f"wrote {len(examples)} examples to {out}", err=True)


def _read_predictions(path: Path) -> dict[str, str]:
    rows, _ = read_jsonl(path)
    preds = {}
    for no, rec in rows:
        if "id" not in rec or "text" not in rec:
            raise SpecopsError(f'{path}:{no}: expected a JSON object with "id" and "text"')
        pid, text = str(rec["id"]), rec["text"]
        if not isinstance(text, str):
            raise SpecopsError(f'{path}:{no}: "text" must be a string')
        preds[pid] = text
    return preds


@app.command()
@clean_errors
def score(
    pred: Path = typer.Option(..., "--pred", help='JSONL predictions: {"id", "text"} per line.'),
    gold: Path = typer.Option(..., "--gold", help="JSONL gold examples as written by `synth`."),
    json_out: Optional[Path] = typer.Option(None, "--json-out", help="Also write the report as JSON here."),
) -> None:
    """Score predictions against gold: parse/valid rates, exact match, per-field accuracy and F1.

    A gold example without a prediction is scored as an empty answer (unparsed), so gaps lower the scores.
    """
    from rich.console import Console
    from rich.table import Table

    from specops.task import scoring
    from specops.task.synth import read_examples

    golds = read_examples(gold)
    preds = _read_predictions(pred)
    if not golds:
        raise SpecopsError(f"{gold} holds no examples")
    gold_ids = {e.id for e in golds}
    unknown = [i for i in preds if i not in gold_ids]
    if unknown:
        raise SpecopsError(f"{len(unknown)} prediction ids are not in {gold} (first: {unknown[0]!r})")
    missing = sum(e.id not in preds for e in golds)
    report = scoring.score([preds.get(e.id, "") for e in golds], [e.gold for e in golds])

    console = Console()
    summary = Table(title=f"task metrics (n={report.n})")
    for col in ("parse", "valid", "exact", "field acc", "micro F1", "macro F1"):
        summary.add_column(col, justify="right")
    summary.add_row(*(f"{v:.3f}" for v in (report.parse_rate, report.valid_rate, report.exact_match,
                                           report.field_accuracy, report.micro_f1, report.macro_f1)))
    console.print(summary)
    fields = Table(title="per field")
    fields.add_column("field")
    fields.add_column("exact", justify="right")
    fields.add_column("F1", justify="right")
    for name, acc in report.per_field.items():
        fields.add_row(name, f"{acc:.3f}", f"{report.per_field_f1[name]:.3f}")
    console.print(fields)
    if missing:
        typer.secho(f"note: {missing} gold examples had no prediction and were scored as empty", fg="yellow", err=True)
    if json_out is not None:
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(dict(report.to_dict(), missing=missing), indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            raise SpecopsError(f"cannot write {json_out}: {e}") from None
