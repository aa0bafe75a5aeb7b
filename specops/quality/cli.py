"""`specops quality`: compare a candidate configuration's answers with a baseline's on the same prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specops.errors import SpecopsError, clean_errors


def _ci(d: Optional[dict], fmt: str = "{:+.3f}") -> str:
    if not d or d.get("value") is None:
        return "–"
    ci = f" [{fmt.format(d['ci95_low'])}, {fmt.format(d['ci95_high'])}]" if d.get("ci95_low") is not None else ""
    return fmt.format(d["value"]) + ci


def print_report(result: dict, console) -> None:
    from rich.table import Table

    t = Table(title="quality: candidate vs baseline")
    t.add_column("part", justify="left")
    t.add_column("result", justify="left")
    loss = result["lossless"]
    t.add_row("lossless", f"{loss['identical']}/{loss['pairs']} identical ({loss['compared_by']})")
    for d in loss["differences"][:3]:
        t.add_row("", f"{d['id']}: first difference at {d['unit']} {d['position']}: {d['baseline']!r} vs "
                      f"{d['candidate']!r}")
    if "field_distributions" in result:
        low = {f: v for f, v in result["field_distributions"].items() if v["p_value"] is not None and v["p_value"] < 0.05}
        t.add_row("field distributions", "no field differs at p < 0.05" if not low else
                  "differ at p < 0.05: " + ", ".join(f"{f} (p = {v['p_value']:.3g})" for f, v in low.items()))
    if "accuracy" in result and result["accuracy"]:
        a = result["accuracy"]
        t.add_row("field accuracy", f"{a['baseline']['field_accuracy']:.3f} → {a['candidate']['field_accuracy']:.3f}, "
                                    f"Δ {_ci(a['difference'])}")
        t.add_row("exact match", f"{a['baseline']['exact_match']:.3f} → {a['candidate']['exact_match']:.3f}, "
                                 f"Δ {_ci(a['exact_match_difference'])}")
    if "judge" in result:
        j = result["judge"]
        t.add_row("judge", f"{j['judge']}, order {j['order']}: candidate win {_ci(j['win'], '{:.1%}')}, "
                           f"tie {_ci(j['tie'], '{:.1%}')}, loss {_ci(j['loss'], '{:.1%}')}")
        bias = "–" if j["position_bias_rate"] is None else f"{j['position_bias_rate']:.1%}"
        p = "–" if j["sign_test_p"] is None else f"{j['sign_test_p']:.3g}"
        t.add_row("", f"sign test p = {p}; position bias {bias}; {j['failed_games']} failed game(s); "
                      f"{j['identical_pairs']} identical pair(s) not judged")
    if "retrieval" in result:
        r = result["retrieval"]
        t.add_row("retrieval", f"overlap@{r['k']} {r['overlap_at_k']:.3f}; identical top-{r['k']} "
                               f"{r['identical_top_k_share']:.1%} of {r['queries']} queries")
    console.print(t)


@clean_errors(interrupted="interrupted; rerun the same command: cached judgments are not asked again")
def quality(
    baseline: str = typer.Option(..., "--baseline", help="Answers: a `specops generate` JSONL, or a sweep run "
                                                         "directory with a selector, RUN:gamma=0,temperature=0."),
    candidate: str = typer.Option(..., "--candidate", help="Answers to compare, in the same forms."),
    out: Path = typer.Option(..., "--out", help="Folder for quality.json and the judge cache."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="The prompts (JSONL records, with 'gold' "
                                                                   "parameters where known)."),
    judge: str = typer.Option("reference", "--judge", help="reference (offline, needs gold), or none."),
    judge_url: Optional[str] = typer.Option(None, "--judge-url", help="OpenAI-compatible server to judge pairwise."),
    judge_model: Optional[str] = typer.Option(None, "--judge-model", help="The judge server's model name."),
    judge_api_key: Optional[str] = typer.Option(None, "--judge-api-key"),
    judge_concurrency: int = typer.Option(8, "--judge-concurrency", min=1, help="Judge requests in flight."),
    judge_timeout: float = typer.Option(60.0, "--judge-timeout", min=0.1, help="Seconds per judge request."),
    order: str = typer.Option("both", "--order", help="both (swap the slots, disagreement = tie) or random."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap and of --order random."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Product catalog for retrieval overlap "
                                                                   "(default: fixtures/catalog.sqlite)."),
    sampled: bool = typer.Option(False, "--sampled", help="The answers were sampled (T > 0): add per-field "
                                                          "two-sample tests."),
) -> None:
    """Lossless check, task accuracy with paired bootstrap CIs, a pairwise judge with position swapping, and the
    overlap of the products each answer retrieves. Writes OUT/quality.json and prints a table."""
    from rich.console import Console
    from rich.progress import Progress

    from specops.files import write_json
    from specops.fixtures.catalog import DEFAULT_PATH
    from specops.quality import compare, outputs

    if order not in ("both", "random"):
        raise SpecopsError("--order must be both or random")
    if judge_url is not None and not judge_model:
        raise SpecopsError("--judge-url needs --judge-model")
    if judge_url is None and judge not in ("reference", "none"):
        raise SpecopsError("--judge must be reference or none (or give --judge-url)")
    spec = compare.JudgeSpec("url" if judge_url else judge, judge_url, judge_model, judge_api_key, judge_concurrency,
                             judge_timeout)
    queries, gold = compare.prompts_and_gold(dataset)
    out.mkdir(parents=True, exist_ok=True)
    with Progress(transient=True) as bar:
        task = bar.add_task("judging", total=None)
        result = compare.run(outputs.load(baseline), outputs.load(candidate), queries, gold, spec, order, seed,
                             catalog or DEFAULT_PATH, out / "judge.sqlite", sampled,
                             lambda done, total: bar.update(task, completed=done, total=total))
    write_json(out / "quality.json", result)
    print_report(result, Console())
    typer.echo(f"wrote {out / 'quality.json'}", err=True)
