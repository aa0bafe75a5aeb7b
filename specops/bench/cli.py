"""`specops bench` (one configuration) and `specops sweep` (the γ × concurrency × temperature grid)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specops.engine.config import DTYPES, parse_gamma_schedule
from specops.errors import clean_errors

app = typer.Typer(help="Serving benchmarks: one configuration or the whole grid.", no_args_is_help=True,
                  pretty_exceptions_enable=False)



BACKEND = typer.Option("embedded", "--backend", help="embedded (specops' server), vllm (real vLLM) or external (--url).")
MODEL = typer.Option(None, "--model", help="Target model directory (embedded, vllm).")
LORA = typer.Option(None, "--lora", help="peft LoRA adapter of the target.")
DRAFT = typer.Option(None, "--draft", help="EAGLE-3 draft directory (needed for γ > 0).")
URL = typer.Option(None, "--url", help="Base URL of an external OpenAI-compatible server.")
API_KEY = typer.Option(None, "--api-key", help="Bearer key the server requires.")
VLLM_PYTHON = typer.Option(None, "--vllm-python", help="Python of the vLLM environment.")
VLLM_ARG = typer.Option([], "--vllm-arg", help="Extra vLLM server argument (repeatable), e.g. --vllm-arg=--enforce-eager.")
RATE = typer.Option(None, "--rate", help="poisson:R for open-loop arrivals at R requests/s (capped by concurrency); "
                                         "default closed loop.")
DATASET = typer.Option(None, "--dataset", help="JSONL prompts: one of query, prompt or messages per line.")
SYNTHETIC = typer.Option(None, "--synthetic", help="Use N synthetic shopper queries as the prompt pool.")
NUM_PROMPTS = typer.Option(64, "--num-prompts", help="Timed requests per configuration (the pool is cycled).")
WAVES = typer.Option(0, "--waves", help="At least N × concurrency timed requests per configuration (closed-loop "
                                        "waves), so high-concurrency points measure more than ramp-up and drain; "
                                        "0: --num-prompts alone.")
CLIENT_PROCS = typer.Option(0, "--client-procs", help="Load generator processes the clients are spread over, so "
                            "that the client's own CPU cannot cap a fast server; 0: one per 8 clients, at most half "
                            "the cores.")
API_PROCS = typer.Option(1, "--api-procs", help="HTTP processes of the embedded server (serve --api-procs), so that "
                         "its parsing and streaming cannot cap a fast engine.")
MAX_TOKENS = typer.Option(128, "--max-tokens", help="max_tokens of every request.")
WARMUP = typer.Option(2, "--warmup", help="Unmeasured requests before each configuration.")
SEED = typer.Option(0, "--seed", help="Seed of the prompt order, arrivals and per-request sampling.")
IGNORE_EOS = typer.Option(False, "--ignore-eos", help="Generate exactly --max-tokens tokens per request.")
SLO = typer.Option("e2e=2000ms", "--slo", help="SLOs for goodput: ttft=, tpot=, e2e= with ms or s, comma-separated.")
COST = typer.Option(None, "--gpu-hourly-cost", help="USD per GPU hour: adds cost per million output tokens.")
GPUS = typer.Option(1, "--gpus", help="GPUs the server uses (for cost).")
MAX_BATCH = typer.Option(None, "--max-batch", help="Server batch limit (default: the largest concurrency).")
GAMMA_SCHEDULE = typer.Option(None, "--gamma-schedule", help="What --gamma schedule runs (embedded backend): γ by "
                              "running batch size as vLLM's num_speculative_tokens_per_batch_size, e.g. "
                              "'[[1,4,5],[5,64,3]]' (a recommendation's embedded.gamma_per_batch_size).")
DEVICE = typer.Option("cpu", "--device", help="Embedded server: cpu, cuda or cuda:N.")
DTYPE = typer.Option("float32", "--dtype", help=f"Embedded server: {', '.join(DTYPES)} (or fp32, bf16, fp16).")


def sweep_config(**kw):
    """The SweepConfig of the options a sweep-like command received (its locals())."""
    from specops.bench import params
    from specops.bench.config import SweepConfig

    return SweepConfig(
        out=kw["out"], backend=kw["backend"], model=kw["model"], lora=kw["lora"], draft=kw["draft"], url=kw["url"],
        api_key=kw["api_key"], vllm_python=kw["vllm_python"], vllm_args=list(kw["vllm_arg"]),
        gammas=params.gamma_list(kw["gamma"]),
        gamma_schedule=parse_gamma_schedule(kw["gamma_schedule"]) if kw.get("gamma_schedule") is not None else None,
        drafters=[d.strip() for d in kw.get("drafter", "eagle3").split(",") if d.strip()],
        json_schema=kw.get("json_schema"),
        concurrencies=params.int_list("--concurrency", kw["concurrency"], 1),
        temperatures=params.float_list("--temperature", kw["temperature"], 0.0),
        repeats=kw.get("repeats", 1), rate=params.rate(kw["rate"]), dataset=kw["dataset"], synthetic=kw["synthetic"],
        num_prompts=kw["num_prompts"], waves=kw.get("waves", 0), max_tokens=kw["max_tokens"], warmup=kw["warmup"],
        seed=kw["seed"], client_procs=kw.get("client_procs", 0), api_procs=kw.get("api_procs", 1),
        one_server=kw.get("one_server", False), ignore_eos=kw["ignore_eos"], slo=params.slo(kw["slo"]),
        resume=kw.get("resume", False), provenance=kw.get("provenance", False),
        gpu_hourly_cost=kw["gpu_hourly_cost"], gpus=kw["gpus"], max_batch=kw["max_batch"],
        device=kw.get("device", "cpu"), dtype=kw.get("dtype", "float32"),
    )


@app.command()
@clean_errors
def sweep(
    out: Path = typer.Option(..., "--out", help="Run directory (SQLite store, results.json/.csv, recommendation.json)."),
    backend: str = BACKEND, model: Optional[Path] = MODEL, lora: Optional[Path] = LORA, draft: Optional[Path] = DRAFT,
    url: Optional[str] = URL, api_key: Optional[str] = API_KEY, vllm_python: Optional[Path] = VLLM_PYTHON,
    vllm_arg: list[str] = VLLM_ARG,
    gamma: str = typer.Option("0,1,3,5", "--gamma", help="Speculative tokens per step; 0 = no draft; auto = chosen by "
                              "the engine every step, schedule = by batch size from --gamma-schedule (embedded "
                              "backend)."),
    gamma_schedule: Optional[str] = GAMMA_SCHEDULE,
    drafter: str = typer.Option("eagle3", "--drafter", help="Drafters to compare, comma-separated: eagle3, "
                                "schema+eagle3 (at each γ > 0), schema (forced tokens alone, once). The schema ones "
                                "need --json-schema."),
    json_schema: Optional[Path] = typer.Option(None, "--json-schema", help="Every request asks for answers in this "
                                               "JSON schema (response_format json_schema)."),
    concurrency: str = typer.Option("1,4,16,32,64", "--concurrency", help="Clients (closed loop) or in-flight cap."),
    temperature: str = typer.Option("0,0.7", "--temperature", help="Sampling temperatures."),
    repeats: int = typer.Option(1, "--repeats", help="Measurements per configuration (≥ 2 gives speedup CIs)."),
    rate: Optional[str] = RATE, dataset: Optional[Path] = DATASET, synthetic: Optional[int] = SYNTHETIC,
    num_prompts: int = NUM_PROMPTS, waves: int = WAVES, client_procs: int = CLIENT_PROCS, api_procs: int = API_PROCS,
    max_tokens: int = MAX_TOKENS, warmup: int = WARMUP,
    seed: int = SEED, ignore_eos: bool = IGNORE_EOS, slo: str = SLO,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out; finished configurations are kept."),
    provenance: bool = typer.Option(False, "--provenance", help="Record each answer's draft provenance (specops "
                                                                "servers) for `specops acceptance --run`."),
    one_server: bool = typer.Option(False, "--one-server", help="Measure every γ (above 0, and schedule) on one "
                                    "embedded server, switching its γ table between points and taking the γ values "
                                    "in turn within each repeat: their ratios then hold no spread between servers."),
    gpu_hourly_cost: Optional[float] = COST, gpus: int = GPUS, max_batch: Optional[int] = MAX_BATCH,
    device: str = DEVICE, dtype: str = DTYPE,
) -> None:
    """Measure the (drafter, γ) × concurrency × temperature grid, one server per (drafter, γ) (or one for every γ,
    --one-server); resumable after any interruption."""
    from specops.bench.sweep import run_sweep

    cfg = sweep_config(**locals())
    out_dir = run_sweep(cfg)
    typer.echo(f"wrote {out_dir / 'results.json'}, {out_dir / 'results.csv'}, {out_dir / 'recommendation.json'}",
               err=True)


@app.command()
@clean_errors
def bench(
    backend: str = BACKEND, model: Optional[Path] = MODEL, lora: Optional[Path] = LORA, draft: Optional[Path] = DRAFT,
    url: Optional[str] = URL, api_key: Optional[str] = API_KEY, vllm_python: Optional[Path] = VLLM_PYTHON,
    vllm_arg: list[str] = VLLM_ARG,
    gamma: str = typer.Option("3", "--gamma", help="Speculative tokens per step; 0 = no draft; auto or schedule "
                              "(with --gamma-schedule) on the embedded backend."),
    gamma_schedule: Optional[str] = GAMMA_SCHEDULE,
    drafter: str = typer.Option("eagle3", "--drafter", help="eagle3, schema+eagle3 or schema (the schema ones need "
                                                            "--json-schema)."),
    json_schema: Optional[Path] = typer.Option(None, "--json-schema", help="Every request asks for answers in this "
                                               "JSON schema (response_format json_schema)."),
    concurrency: str = typer.Option("1", "--concurrency", help="Clients (closed loop) or in-flight cap."),
    temperature: str = typer.Option("0", "--temperature", help="Sampling temperature."),
    rate: Optional[str] = RATE, dataset: Optional[Path] = DATASET, synthetic: Optional[int] = SYNTHETIC,
    num_prompts: int = NUM_PROMPTS, waves: int = WAVES, client_procs: int = CLIENT_PROCS, api_procs: int = API_PROCS,
    max_tokens: int = MAX_TOKENS, warmup: int = WARMUP,
    seed: int = SEED, ignore_eos: bool = IGNORE_EOS, slo: str = SLO, gpu_hourly_cost: Optional[float] = COST,
    gpus: int = GPUS, max_batch: Optional[int] = MAX_BATCH, device: str = DEVICE, dtype: str = DTYPE,
    out: Optional[Path] = typer.Option(None, "--out", help="Keep the run directory here (default: temporary)."),
) -> None:
    """Measure one configuration and print its metrics as JSON."""
    from specops.bench.sweep import run_bench

    row = run_bench(sweep_config(**locals()))
    typer.echo(json.dumps(row, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    app()
