"""`specops acceptance`: which tokens each draft gets right, by token class, schema field and draft position."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specops.errors import SpecopsError, clean_errors


def print_tables(result: dict, console) -> None:
    from rich.table import Table

    drafts = result["drafts"]
    t = Table(title="acceptance by token class (kept when reached; rejections share)")
    t.add_column("class")
    for name in drafts:
        t.add_column(name, justify="right")
    classes = sorted({c for d in drafts.values() for c in d["per_class"]})
    for c in classes:
        cells = []
        for d in drafts.values():
            counts = d["class_counts"].get(c)
            if counts is None:
                cells.append("–")
                continue
            rate = d["per_class"][c]
            share = d["rejection_share_by_class"].get(c, 0.0)
            cells.append(f"{rate:.2f} ({counts['accepted']}/{counts['accepted'] + counts['rejected']}; {share:.0%})")
        t.add_row(c, *cells)
    t.add_row("[bold]rate / mean length[/]", *[f"{d['acceptance_rate']:.3f} / {d['mean_acceptance_length']:.2f}"
                                               for d in drafts.values()])
    t.add_row("[bold]rejections on schema tokens[/]",
              *[("–" if d["schema_rejection_share"] is None else f"{d['schema_rejection_share']:.0%}")
                for d in drafts.values()])
    t.add_row("[bold]per position[/]", *[" ".join(f"{r:.2f}" for r in d["per_position"]) for d in drafts.values()])
    console.print(t)
    f = Table(title="acceptance by schema field (kept when reached)")
    f.add_column("field")
    for name in drafts:
        f.add_column(name, justify="right")
    for fld in sorted({k for d in drafts.values() for k in d["per_field"]}):
        f.add_row(fld, *[("–" if d["per_field"].get(fld) is None else f"{d['per_field'][fld]:.2f}")
                         for d in drafts.values()])
    console.print(f)
    for a in result["advice"]:
        console.print(f"advice: {a}")


@clean_errors
def acceptance(
    out: Path = typer.Option(..., "--out", help="Folder for acceptance.json and acceptance.png."),
    model: Optional[Path] = typer.Option(None, "--model", help="Target model directory (its tokenizer is needed with "
                                                               "--run too)."),
    lora: Optional[Path] = typer.Option(None, "--lora", help="peft LoRA adapter of the target."),
    draft: list[Path] = typer.Option([], "--draft", help="EAGLE-3 draft directory; repeat to compare drafts."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL requests (query, prompt or messages)."),
    run: Optional[Path] = typer.Option(None, "--run", help="A sweep's run directory recorded with --provenance, "
                                                           "instead of --prompts and --draft."),
    json_schema: Optional[Path] = typer.Option(None, "--json-schema", help="Constrain every answer to this JSON "
                                                                           "schema (file)."),
    gamma: int = typer.Option(3, "--gamma", min=1, help="Speculative tokens per step."),
    drafter: str = typer.Option("eagle3", "--drafter", help="eagle3 | schema+eagle3 (adds the tokens the schema "
                                                            "forces; needs --json-schema)."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Use the first N prompts."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (temperature > 0)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    dtype: str = typer.Option("float32", "--dtype"),
) -> None:
    """Decode the prompts with each draft (provenance on), classify every drafted position with a JSON lexer, and
    report acceptance per token class, schema field and draft position, with advice; or read a sweep's recorded
    provenance (--run). Writes OUT/acceptance.json and OUT/acceptance.png (class × position heatmap)."""
    from rich.console import Console
    from rich.progress import Progress

    from specops.analysis import heatmap, measure
    from specops.engine.config import EngineConfig
    from specops.engine.sampling import SamplingParams
    from specops.files import read_json, write_json
    from specops.inputs import read_records, record_prompt_ids, schema_format
    from specops.models.target import load_tokenizer

    if model is None:
        raise SpecopsError("--model is required (the target, or the run's target for its tokenizer)")
    if not (Path(model) / "config.json").is_file():
        raise SpecopsError(f"--model: model directory not found or without config.json: {model}")
    tokenizer = load_tokenizer(model, read_json(Path(model) / "config.json")["vocab_size"])
    if (run is None) == (prompts is None):
        raise SpecopsError("give exactly one of --prompts FILE.jsonl (with --draft) or --run RUN_DIR")
    if run is not None:
        result = measure.from_run(run, tokenizer, temperature=temperature)
    else:
        if not draft:
            raise SpecopsError("--prompts needs at least one --draft")
        if drafter.startswith("schema") and json_schema is None:
            raise SpecopsError(f"--drafter {drafter} drafts the tokens a schema forces: give --json-schema FILE")
        cfg = EngineConfig(model=model, lora=lora, gamma=gamma, device=device, dtype=dtype, drafter=drafter).validate()
        for d in draft:
            if not Path(d).is_dir():
                raise SpecopsError(f"--draft: directory not found: {d}")
        fmt = schema_format(json_schema) if json_schema is not None else None
        records, _ = read_records(prompts)
        records = records[:num_prompts] if num_prompts else records
        ids = [record_prompt_ids(tokenizer, r) for r in records]
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                seed=None if temperature == 0 else seed)
        with Progress(transient=True) as bar:
            tasks: dict[str, int] = {}

            def progress(name: str, done: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=total)
                bar.update(tasks[name], completed=done)

            result = measure.measure(cfg, draft, ids, params, fmt, progress)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "acceptance.json", result)
    heatmap.write(result["drafts"], out / "acceptance.png")
    print_tables(result, Console())
    typer.echo(f"wrote {out / 'acceptance.json'} and {out / 'acceptance.png'}", err=True)
