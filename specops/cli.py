"""The one command-line interface. Heavy modules are imported inside commands so `--help` stays instant."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from specops.engine.config import DRAFTERS, DTYPES, LORA_MODES, EngineConfig, parse_gamma
from specops.errors import SpecopsError, clean_errors

app = typer.Typer(
    name="specops",
    help="EAGLE-3 speculative decoding for LoRA-fine-tuned models: serve it, measure it, explain it.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register_subcommands() -> None:
    from specops.analysis.cli import acceptance
    from specops.bench import cli as bench_cli
    from specops.fixtures.cli import app as fixtures_app
    from specops.quality.cli import quality
    from specops.study import cli as study_cli
    from specops.task.cli import app as task_app
    from specops.training.cli import train_draft

    app.add_typer(task_app, name="task", help="The commerce task: synthetic data and scoring.")
    app.add_typer(fixtures_app, name="fixtures", help="Build the bundled fixture models from the project's own recipe.")
    app.command("train-draft")(train_draft)
    app.command("bench")(bench_cli.bench)
    app.command("sweep")(bench_cli.sweep)
    app.command("acceptance")(acceptance)
    app.command("quality")(quality)
    app.command("study")(study_cli.study)
    app.command("report")(study_cli.report)


_register_subcommands()

# The engine settings `generate` and `serve` share (EngineConfig's fields, one flag each).
MODEL = typer.Option(..., "--model", help="Target model directory (Hugging Face layout, safetensors).")
LORA = typer.Option(None, "--lora", help="peft LoRA adapter directory to apply to the target.")
LORA_MODE = typer.Option("merged", "--lora-mode", help=f"{' or '.join(LORA_MODES)}: fold the adapter into the "
                                                       "weights at load, or add it in the forward.")
DRAFT = typer.Option(None, "--draft", help="EAGLE-3 draft directory; enables speculative decoding.")
GAMMA = typer.Option("3", "--gamma", help="Speculative tokens per step (0 = plain decoding), or auto: chosen every "
                     "step from the batch size and the running acceptance (cost model E/(γc + v), calibrated once "
                     "and stored next to the draft).")
GAMMA_SCHEDULE = typer.Option(None, "--gamma-schedule", help="γ by running batch size instead of one --gamma, in "
                              "vLLM's num_speculative_tokens_per_batch_size form: a JSON list of inclusive "
                              "\\[start, end, γ] batch-size ranges from 1, each starting after the one before, e.g. "
                              "'[[1,4,5],[5,16,3],[17,64,1]]' (larger batches keep the last γ). --gamma becomes its "
                              "largest γ.")
DEVICE = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N.")
DTYPE = typer.Option("float32", "--dtype", help=f"Weights and KV cache: {', '.join(DTYPES)} (or fp32, bf16, fp16).")
MAX_BATCH = typer.Option(16, "--max-batch", min=1, help="Requests decoded together (continuous batching).")
MAX_SEQ_LEN = typer.Option(1024, "--max-seq-len", min=16, help="Prompt + completion tokens per request.")
CUDA_GRAPHS = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                           help="On CUDA, replay each decode round as a captured CUDA graph.")
PREFIX_CACHE = typer.Option(True, "--prefix-cache/--no-prefix-cache",
                            help="Keep the keys and values of prompt prefixes requests share (a system prompt) and "
                                 "prefill only the rest of a prompt that starts with one.")
DRAFTER = typer.Option("eagle3", "--drafter", help=f"{' | '.join(DRAFTERS)}: what proposes draft tokens. schema+eagle3 "
                       "adds the tokens a request's JSON schema forces (beyond --gamma); schema proposes those alone, "
                       "without a draft model.")


def engine_config(model: Path, lora: Optional[Path], lora_mode: str, draft: Optional[Path], gamma: str,
                  device: str, dtype: str, max_batch: int, max_seq_len: int, cuda_graphs: bool,
                  drafter: str, gamma_schedule: Optional[str], prefix_cache: bool) -> EngineConfig:
    g, adaptive = parse_gamma(gamma)
    return EngineConfig(model=model, lora=lora, lora_mode=lora_mode, draft=draft, gamma=g, adaptive_gamma=adaptive,
                        device=device, dtype=dtype, max_batch=max_batch, max_seq_len=max_seq_len,
                        cuda_graphs=cuda_graphs, drafter=drafter, gamma_schedule=gamma_schedule,
                        prefix_cache=prefix_cache).validate()


@app.command()
@clean_errors
def generate(
    model: Path = MODEL,
    prompts: Path = typer.Option(..., "--prompts", help='JSONL requests: {"id", "query"|"prompt"|"messages"} per line.'),
    out: Path = typer.Option(..., "--out", help='JSONL output: {"id", "text", "token_ids", "finish_reason", "spec"}.'),
    lora: Optional[Path] = LORA, lora_mode: str = LORA_MODE, draft: Optional[Path] = DRAFT, gamma: str = GAMMA,
    gamma_schedule: Optional[str] = GAMMA_SCHEDULE,
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(0, "--top-k", min=0, help="0 = no top-k cut."),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (each request gets its own generator)."),
    provenance: bool = typer.Option(False, "--provenance",
                                    help="Add each output's per-round record: drafts proposed, accepted, emitted."),
    json_schema: Optional[Path] = typer.Option(None, "--json-schema",
                                               help="JSON schema file every output must follow (constrained decoding)."),
    drafter: str = DRAFTER,
    device: str = DEVICE, dtype: str = DTYPE, max_batch: int = MAX_BATCH, max_seq_len: int = MAX_SEQ_LEN,
    cuda_graphs: bool = CUDA_GRAPHS, prefix_cache: bool = PREFIX_CACHE,
) -> None:
    """Decode a file of requests with the embedded engine (speculatively when --draft is given)."""
    from specops import generate as gen

    cfg = engine_config(model, lora, lora_mode, draft, gamma, device, dtype, max_batch, max_seq_len, cuda_graphs,
                        drafter, gamma_schedule, prefix_cache)
    stats = gen.run(cfg, prompts=prompts, out=out, temperature=temperature, top_p=top_p, top_k=top_k,
                    max_tokens=max_tokens, seed=seed, provenance=provenance, json_schema=json_schema)
    typer.echo(f"wrote {out}", err=True)
    if stats["num_drafts"]:
        typer.echo(
            f"acceptance rate {stats['acceptance_rate']:.3f}, mean acceptance length {stats['mean_acceptance_length']:.3f}",
            err=True,
        )


@app.command()
@clean_errors
def serve(
    model: Path = MODEL, lora: Optional[Path] = LORA, lora_mode: str = LORA_MODE, draft: Optional[Path] = DRAFT,
    gamma: str = GAMMA, gamma_schedule: Optional[str] = GAMMA_SCHEDULE,
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    api_key: Optional[str] = typer.Option(None, "--api-key",
                                          help="Require 'Authorization: Bearer KEY' on every route but /health."),
    max_queue: int = typer.Option(256, "--max-queue", min=1, help="Requests in flight before answering 429."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name",
                                                    help="Name clients send as 'model' (default: --model as given)."),
    engine_process: Optional[bool] = typer.Option(
        None, "--engine-process/--engine-thread",
        help="Run the engine in a process of its own, so its host work and the HTTP event loop's run in parallel "
             "(default on CUDA), or on a thread of the server (default on the CPU: one process to start)."),
    api_procs: int = typer.Option(
        1, "--api-procs", min=1,
        help="HTTP processes sharing the port and the one engine process (as vLLM's --api-server-count), for when "
             "one process's parsing and streaming cannot keep up with the engine; --max-queue is split between them "
             "and /metrics adds them up. Above 1 it implies --engine-process."),
    gamma_endpoint: bool = typer.Option(
        False, "--gamma-endpoint",
        help="Serve POST /admin/gamma-schedule with {\"gamma_schedule\": [[1,64,3]]}: the running engine drafts by "
             "that table from then on, up to --gamma (how `sweep --one-server` compares γ values on one server)."),
    drafter: str = DRAFTER,
    device: str = DEVICE, dtype: str = DTYPE, max_batch: int = MAX_BATCH, max_seq_len: int = MAX_SEQ_LEN,
    cuda_graphs: bool = CUDA_GRAPHS, prefix_cache: bool = PREFIX_CACHE,
) -> None:
    """OpenAI-compatible HTTP server over the engine: /v1/completions, /v1/chat/completions, /metrics, /health."""
    import logging

    from specops.serve.server import run_server

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = engine_config(model, lora, lora_mode, draft, gamma, device, dtype, max_batch, max_seq_len, cuda_graphs,
                        drafter, gamma_schedule, prefix_cache)
    run_server(cfg, host=host, port=port, api_key=api_key, max_queue=max_queue, served_model_name=served_model_name,
               engine_process=engine_process, api_procs=api_procs, gamma_endpoint=gamma_endpoint)


@app.command()
@clean_errors(interrupted="interrupted; run the demo again to continue where it stopped")
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Run directory of the demo study (report.html inside)."),
    num_queries: int = typer.Option(24, "--num-queries", min=1, help="Held-out synthetic shopper queries."),
    gamma: int = typer.Option(3, "--gamma", min=1, help="Speculative tokens per step for the draft runs."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over instead of re-using an earlier demo run."),
) -> None:
    """The main job on the bundled fixtures: the study in miniature (sweep, quality, acceptance, recommendation,
    report) through the embedded server; about 3 minutes on two CPU cores."""
    from specops import demo as demo_mod

    report = demo_mod.run(out_dir=out, num_queries=num_queries, gamma=gamma, fresh=fresh)
    typer.echo(f"report: {report}")


@app.command()
@clean_errors
def search(
    params: str = typer.Option(..., "--params", help="One answer: the JSON search parameters (or @FILE)."),
    k: int = typer.Option(10, "--k", min=1, help="Products to show."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Catalog SQLite (default: fixtures/catalog.sqlite)."),
) -> None:
    """Run one answer's parameters as a search of the product catalog and print the products it finds."""
    from rich.console import Console
    from rich.table import Table

    from specops.fixtures.catalog import DEFAULT_PATH
    from specops.task.catalog import open_catalog
    from specops.task.catalog import search as run_search
    from specops.task.schema import validate
    from specops.task.scoring import parse

    text = Path(params[1:]).read_text(encoding="utf-8") if params.startswith("@") else params
    answer = parse(text)
    if answer is None:
        raise SpecopsError("--params holds no JSON object")
    problems = validate(answer)
    if problems:
        raise SpecopsError("the parameters do not satisfy the contract: " + "; ".join(problems[:3]))
    conn = open_catalog(catalog or DEFAULT_PATH)
    try:
        rows = run_search(conn, answer, k)
    finally:
        conn.close()
    table = Table(title=f"{len(rows)} product(s)")
    for col in ("id", "title", "price (USD)", "rating", "stock", "free shipping", "condition"):
        table.add_column(col, justify="left" if col == "title" else "right")
    for r in rows:
        table.add_row(str(r["id"]), r["title"], f"{r['price_usd']:.2f}", f"{r['rating']:g}", str(r["stock"]),
                      "yes" if r["free_shipping"] else "no", r["condition"])
    Console().print(table)


def main() -> None:
    app(prog_name="specops")


if __name__ == "__main__":
    sys.exit(main())
