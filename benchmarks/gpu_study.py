"""The study's grid on one GPU, with a target big enough that its curves mean something for GPU serving.

Stages, each kept in ``--work`` and skipped when its output is already there, so a run that stops at a time limit
goes on where it stopped when started again:

1. ``models``: the fixture recipe scaled up (``recipe.STUDY``: a ≈ 158 M-parameter Llama, head_dim 64, bf16
   weights), base + LoRA + merged target trained on the GPU, and the target's task quality on the held-out queries.
2. ``draft``: its domain EAGLE-3 draft, self-distilled from the target's own greedy answers (training-time test).
3. ``grid``: ``specops sweep`` through the real server (``specops serve --device cuda --dtype bfloat16
   --api-procs 4``: one HTTP process cannot stream what this model generates at high concurrency): γ 0/1/3/5
   × concurrency 1/4/16/32/64 × temperature 0/0.7 on the held-out commerce queries, repeated for speedup CIs, each
   point at least 16 closed-loop waves long (``sweep --waves``): the drain at a run's end, when clients run out of
   requests and the server is no longer loaded to the concurrency, lasts about one request, a sixteenth of the run;
   γ 0 and 3 (the goals' points) first, then the step costs (4), then the same sweep resumed with γ 1 and 5.
4. ``costs``: the step costs of the speculative model per batch size and temperature (greedy, or sampling: the
   distributions and the rejection test cost more), from the engine's CUDA-graph replays in bf16: a plain step, the
   verification of γ + 1 tokens (v) and a draft step (c), relative to the plain step; and one request's prefill
   at the held-out prompts' mean length, as a loaded server admits requests: one at a time, with the positions
   the prefix cache serves those prompts copied, not computed.
5. ``schedule``: per temperature, the recommendation's per-batch-size γ table applied (``--gamma-schedule``) in a
   sweep of its own (as many repeats as the grid) beside each fixed γ the grid found best at some concurrency, all
   on one server whose γ table is switched between points (``--one-server``): the schedule is set against the best
   fixed γ at each concurrency, free of the spread between two servers.

Then it prints the table (tok/s, TTFT/TPOT/E2E p50 and p99, acceptance, mean acceptance length, speedup over γ = 0
with its 95 % CI, goodput under the 2 s SLO, the speedup E/(γc + v) predicted from the measured acceptance and step
costs, and, since that formula models decoding alone, the same with each request's prefill counted, the decode
speedup (TPOT) and the share of each request spent before its first token) and writes ``study.json`` with the
sweeps' ``results.json``/``results.csv``/``recommendation.json`` to ``$OUT`` (or ``--out``) after every call,
finished or not.

    python benchmarks/gpu_study.py --work DIR            # one CUDA GPU; repeat the same command until it exits 0
    python benchmarks/gpu_study.py --tiny --device cpu   # every stage at a tiny size: a check of the script

The exit code is 0 once every stage is complete, 3 while some remain. Where a job may hold the GPU only minutes at a
time, point ``--work`` at a folder that outlives one command: a call that ends in the LoRA stage keeps the finished
base, and the next one goes on from it. On an H100 the models took 4–5 minutes (a pretraining step 51–64 ms, a
LoRA step 185–230 ms at batch 96, both bound by kernel launches), the draft about 2, the grid with the defaults
7–9 and the schedule's sweeps, with the fixed γ values measured again beside the schedule, 6–7 when each
configuration had a server of its own (a server start of 40–55 s each; they now share one): 20–24 minutes in all.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

GAMMAS, CONCURRENCY, TEMPERATURES = [0, 1, 3, 5], [1, 4, 16, 32, 64], [0.0, 0.7]
FIRST_GAMMAS = (0, 3)  # measured before the rest of the grid (one sweep directory: the second pass resumes it)
START = time.monotonic()


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny model, budgets and grid: a check of the script")
    ap.add_argument("--work", type=Path, default=REPO / ".study", help="where models and sweeps are kept between calls")
    ap.add_argument("--out", type=Path, default=None, help="folder for the results (default: $OUT, else --work)")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="stop starting work after this many seconds and write what is done (default 540)")
    ap.add_argument("--num-prompts", type=int, default=None,
                    help="timed requests per configuration (default 100: each held-out query once)")
    ap.add_argument("--waves", type=int, default=None,
                    help="at least this many × concurrency timed requests per configuration (default 16)")
    ap.add_argument("--max-tokens", type=int, default=None, help="max_tokens per request (default 160)")
    ap.add_argument("--repeats", type=int, default=None, help="measurements per configuration (default 2)")
    ap.add_argument("--concurrency", type=concurrencies, default=None,
                    help="comma-separated concurrencies (default 1,4,16,32,64); a subset re-measures part of the grid, "
                         "and the schedule is then recommended from that part")
    ap.add_argument("--api-procs", type=int, default=None,
                    help="HTTP processes of the server (serve --api-procs; default 4, 1 with --tiny): one cannot "
                         "stream what a small model on a GPU generates at concurrency 64")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def concurrencies(text: str) -> list[int]:
    from specops.bench.params import int_list
    from specops.errors import SpecopsError

    try:
        return int_list("--concurrency", text, 1)
    except SpecopsError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--concurrency: ")) from None


def log(msg: str) -> None:
    print(f"[{time.monotonic() - START:7.1f} s] {msg}", flush=True)


def left(args) -> float:
    return args.budget_s - (time.monotonic() - START)


def progress_printer():
    """Training progress as a line per tenth of each stage."""
    def show(stage: str, step: int, total: int, loss: float) -> None:
        if total and (step == total or step % max(1, total // 10) == 0):
            log(f"  {stage} {step}/{total}" + (f" loss {loss:.3f}" if loss == loss else ""))
    return show


def settings(args):
    """(model recipe, draft settings, sweep settings) for the run or its tiny check."""
    from specops.fixtures.recipe import QUICK, STUDY

    if args.tiny:  # the study's recipe with the quick build's budgets and a tiny shape (head_dim kept at 64)
        budgets = {k: getattr(QUICK, k) for k in ("corpus_docs", "tokenizer_docs", "pretrain_steps", "pretrain_batch",
                                                  "train_examples", "lora_steps", "lora_batch")}
        recipe = replace(STUDY, **budgets, hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1,
                         eval_examples=8, max_new_tokens=24)
        draft = dict(prompts=40, epochs=1.0, batch_size=8, lr=3e-3, vocab=256, max_new_tokens=24, eval_prompts=4,
                     max_batch=8)
        sweep = dict(gammas=[0, 3], concurrency=[1, 4], temperatures=[0.0, 0.7], num_prompts=6, waves=2,
                     max_tokens=16, repeats=2, warmup=1, parts_batches=[1, 4], dtype="float32", api_procs=1)
    else:
        recipe = STUDY
        draft = dict(prompts=4000, epochs=3.0, batch_size=32, lr=2e-3, vocab=1024, max_new_tokens=160, eval_prompts=32,
                     max_batch=64)
        sweep = dict(gammas=GAMMAS, concurrency=CONCURRENCY, temperatures=TEMPERATURES, num_prompts=100, waves=16,
                     max_tokens=160, repeats=2, warmup=4, parts_batches=CONCURRENCY, dtype="bfloat16", api_procs=4)
    for key in ("num_prompts", "waves", "max_tokens", "repeats", "api_procs"):
        if getattr(args, key) is not None:
            sweep[key] = getattr(args, key)
    if args.concurrency is not None:
        sweep["concurrency"] = sweep["parts_batches"] = args.concurrency
    return recipe, draft, sweep


# -- stages --------------------------------------------------------------------------------------------------------

def stage_models(args, recipe) -> dict:
    """base/, lora/, target-merged/ and models.json (sizes, quality, time) under work/models."""
    from specops.files import write_json
    from specops.fixtures.recipe import build_models, setup_determinism

    done = args.work / "models" / "models.json"
    if done.is_file():
        return json.loads(done.read_text())
    tmp = args.work / ".models.partial"  # a base finished by an earlier call is kept (build_models resumes there)
    log("models: " + ("LoRA and merge on the base trained before" if (tmp / "base").is_dir()
                      else "training base, LoRA and merge"))
    setup_determinism(args.seed, args.device)
    for name in ("lora", "target-merged"):
        shutil.rmtree(tmp / name, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    summary = build_models(tmp, recipe, args.seed, progress_printer(), args.device)
    summary.update(seconds=round(time.monotonic() - t0, 1), recipe=asdict(recipe), device=device_name(args.device))
    write_json(tmp / "models.json", summary)
    tmp.rename(args.work / "models")  # complete or absent
    t = summary["target"]
    log(f"models: done in {summary['seconds']:.0f} s; held-out schema-valid {t['valid_rate']:.3f}, "
        f"field accuracy {t['field_accuracy']:.3f}")
    return summary


def stage_draft(args, recipe, d: dict) -> dict:
    """The domain draft under work/draft-domain (the training pipeline resumes its own partial state)."""
    from specops.fixtures.recipe import heldout_examples
    from specops.training import pipeline
    from specops.training.train import TrainConfig

    out = args.work / "draft-domain"
    if (out / "train_report.json").is_file():
        return json.loads((out / "train_report.json").read_text())
    log("draft: self-distilled domain EAGLE-3 draft")
    heldout = tuple(e.query for e in heldout_examples(recipe.eval_examples))
    job = pipeline.Job(
        target=args.work / "models" / "target-merged", out=out,
        source=pipeline.Source("synthetic", d["prompts"], exclude=heldout), draft_vocab_size=d["vocab"],
        online=True, device=args.device, max_new_tokens=d["max_new_tokens"], eval_prompts=d["eval_prompts"],
        max_batch=d["max_batch"],
        train=TrainConfig(epochs=d["epochs"], batch_size=d["batch_size"], lr=d["lr"], ttt_steps=3, seed=args.seed + 2))
    t0 = time.monotonic()
    last = {}

    def show(stage, done, total, fields):
        if total and (done == total or done % max(1, total // 10) == 0) and last.get(stage) != done:
            last[stage] = done
            loss = f" loss {fields['loss']:.3f}" if "loss" in fields else ""
            log(f"  {stage} {done}/{total}{loss}")

    report = pipeline.run(job, show)
    report["seconds"] = round(time.monotonic() - t0, 1)
    (out / "train_report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    after = report["acceptance"]["after"] or {}
    log(f"draft: done in {report['seconds']:.0f} s; held-out acceptance {after.get('acceptance_rate')}, "
        f"mean acceptance length {after.get('mean_acceptance_length')}")
    return report


def stage_costs(args, s: dict) -> list[dict]:
    """c and v(γ) per batch size from the serving engine's own rounds (bf16, CUDA graphs on the GPU)."""
    import torch

    from specops.bench.workload import from_dataset
    from specops.engine.engine import Engine
    from specops.engine.gamma import measure_parts, measure_prefill
    from specops.inputs import chat_prompt_ids

    path = args.work / "costs.json"
    if path.is_file():
        return json.loads(path.read_text())
    log("costs: plain, verify and draft steps per batch size, and a prefill")
    engine = Engine.load(args.work / "models" / "target-merged", args.work / "draft-domain", gamma=max(s["gammas"]),
                         device=args.device, dtype=s["dtype"], max_batch=max(s["concurrency"]), max_seq_len=1024)
    gammas = [g for g in s["gammas"] if g > 0]
    pool = from_dataset(args.work / "prompts.jsonl")
    prompts = [chat_prompt_ids(engine.tokenizer, p.messages) for p in pool]
    prompt_tokens, cached = round(sum(map(len, prompts)) / len(prompts)), cached_positions(prompts)
    parts = []
    for t in s["temperatures"]:
        prefill_ms = measure_prefill(engine.runner, prompt_tokens, t, cached=cached)
        for p in measure_parts(engine.runner, gammas, s["parts_batches"], temperature=t):
            parts.append({**p, "prompt_tokens": prompt_tokens, "cached_tokens": cached, "prefill_ms": prefill_ms,
                          "prefill": prefill_ms / p["target_ms"]})
    parts = json.loads(json.dumps(parts))
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    path.write_text(json.dumps(parts, indent=2) + "\n")
    for p in parts:
        log(f"costs: T {p['temperature']:g}, batch {p['batch']}: plain step {p['target_ms']:.3f} ms, c {p['c']:.3f}, "
            + ", ".join(f"v({g}) {v:.3f}" for g, v in p["v"].items()) + f", prefill of {p['prompt_tokens']} tokens "
            f"{p['prefill_ms']:.3f} ms ({p['cached_tokens']} from the prefix cache)")
    return parts


def cached_positions(prompts: list[list[int]]) -> int:
    """Mean positions a prompt of ``prompts`` takes from the prefix cache, served one after another as the engine
    admits them (its own bookkeeping: a prefix kept once two prompts share it; 0 when none is)."""
    from specops.engine.engine import PREFIX_SLOTS
    from specops.engine.prefix_cache import PrefixCache

    cache, hits = PrefixCache(list(range(PREFIX_SLOTS))), []
    for prompt in prompts:
        hits.append(cache.plan([prompt]).hits[0][1])
    return round(sum(hits) / len(hits))


def measure_costs(args, s: dict, doc: dict) -> None:
    """The costs stage into ``doc``; the grid does not need it, so a failure is kept in study.json, not raised."""
    if not (args.work / "costs.json").is_file() and left(args) < 90:
        log("costs: no time left to measure them; the predictions stay empty")
        return
    try:
        doc["costs"] = stage_costs(args, s)
    except Exception:
        doc["errors"] = {"costs": traceback.format_exc()}
        log("costs: failed (kept in study.json); going on with the grid")
        print(doc["errors"]["costs"], flush=True)


def write_prompts(args, recipe) -> Path:
    """The held-out queries (never trained on by the LoRA or the draft) as the sweep's prompt pool."""
    from specops.fixtures.recipe import heldout_examples

    path = args.work / "prompts.jsonl"
    if not path.is_file():
        lines = [json.dumps({"query": e.query}, ensure_ascii=False) for e in heldout_examples(recipe.eval_examples)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sweep(args, s: dict, out: Path, prompts: Path, gammas: str, temperatures: str, repeats: int,
          extra: list[str] = ()) -> bool:
    """``specops sweep`` in a subprocess (its server is ``specops serve`` on the device), resumed where a previous
    call stopped; interrupted (and its finished points exported) when the budget runs out. True when complete."""
    models = args.work / "models"
    cmd = [sys.executable, "-m", "specops", "sweep", "--out", str(out), "--backend", "embedded",
           "--model", str(models / "target-merged"), "--draft", str(args.work / "draft-domain"),
           "--gamma", gammas, "--concurrency", ",".join(map(str, s["concurrency"])), "--temperature", temperatures,
           "--repeats", str(repeats), "--dataset", str(prompts), "--num-prompts", str(s["num_prompts"]),
           "--waves", str(s["waves"]), "--max-tokens", str(s["max_tokens"]), "--warmup", str(s["warmup"]),
           "--seed", str(args.seed), "--device", args.device, "--dtype", s["dtype"], "--api-procs", str(s["api_procs"]),
           "--resume", *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    log("sweep: " + " ".join(cmd[3:]))
    proc = subprocess.Popen(cmd, env=env, cwd=REPO)
    try:
        return proc.wait(timeout=max(left(args) - 20, 1)) == 0
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as stop:
        log("sweep: " + ("out of time" if isinstance(stop, subprocess.TimeoutExpired) else "stopped")
            + "; interrupting it (finished configurations are kept)")
        proc.send_signal(signal.SIGINT)  # the sweep exports what it finished
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if isinstance(stop, KeyboardInterrupt):
            raise
        return False


def best_fixed(rows: list[dict], temperature: float, concurrency: int) -> dict | None:
    """The fixed-γ row with the most goodput at that temperature and concurrency, chosen as the recommendation
    chooses its ``best_gamma_goodput``."""
    from specops.bench.recommend import best

    fixed = [r for r in rows if r["temperature"] == temperature and r["concurrency"] == concurrency
             and isinstance(r["gamma"], int)]
    return best(fixed, lambda r: r["goodput_rps"]) if fixed else None


def switching_first(blocks: list[dict]) -> list[dict]:
    """The recommendation's temperatures with the schedules that switch γ first: one that keeps a single γ at every
    batch size is that fixed γ, and its sweep measures little beyond the noise, so it goes last when the budget may
    not reach both."""
    return sorted(blocks, key=lambda b: len({g for *_, g in b["embedded"]["gamma_per_batch_size"]}) == 1)


def stage_schedule(args, s: dict, prompts: Path, out: dict) -> None:
    """Per temperature: the recommended batch-size schedule in a short sweep of its own, side by side with the fixed
    γ values the grid found best at some concurrency (measured again in the same sweep: comparing with the best of
    the grid's noisy figures would favour the fixed side), recorded in ``out`` as it starts (so a stopped run still
    reports what it measured). All of them run on one server that switches its γ table between points and takes
    them in turn within each repeat (``sweep --one-server``): two servers of one configuration can differ by more
    than the goal's margin. A peer of γ = 0 (plain decoding, no draft) needs a server of its own, and then each
    configuration gets one."""
    rec = json.loads((args.work / "grid" / "recommendation.json").read_text())
    for block in switching_first(rec["by_temperature"]):
        t = block["temperature"]
        ranges = block["embedded"]["gamma_per_batch_size"]
        if max(g for *_, g in ranges) == 0:
            out[str(t)] = {"schedule": ranges, "note": "no speculation recommended at any load"}
            continue
        run = args.work / f"schedule-t{t:g}"
        if left(args) < 60:
            break
        peers = sorted({level["best_gamma_goodput"] for level in block["levels"]})
        one_server = 0 not in peers
        out[str(t)] = {"schedule": ranges, "peers": peers, "run": run.name, "one_server": one_server,
                       "complete": False}
        out[str(t)]["complete"] = sweep(args, s, run, prompts, ",".join([*map(str, peers), "schedule"]), f"{t:g}",
                                        s["repeats"], ["--gamma-schedule", json.dumps(ranges)]
                                        + (["--one-server"] if one_server else []))


# -- the report ----------------------------------------------------------------------------------------------------

def host() -> dict:
    """The machine's CPU: at high load the host's side of serving (API processes, the engine's loop, the load
    generator) weighs on the figures, and two machines with one GPU model differ there."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "cpus": os.cpu_count()}


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


def _costs_for(row: dict, parts: list[dict]) -> dict | None:
    """The step costs of the nearest measured batch size at or above the row's concurrency, greedy or sampled like
    the row; None where the row has no prediction (γ = 0 or a schedule, no acceptance, no costs)."""
    if not isinstance(row["gamma"], int) or row["gamma"] == 0 or not row.get("acceptance") or not parts:
        return None
    sampled = row["temperature"] > 0
    same = [p for p in parts if (p.get("temperature", 0.0) > 0) == sampled] or parts  # older files: greedy only
    return next((p for p in same if p["batch"] >= row["concurrency"]), same[-1])


def predicted(row: dict, parts: list[dict]) -> float | None:
    """E/(γc + v) at the row's concurrency and temperature."""
    from specops.engine.gamma import predicted_speedup

    p = _costs_for(row, parts)
    g = row["gamma"]
    return None if p is None else predicted_speedup(row["acceptance"]["mean_acceptance_length"], g, p["c"],
                                                    p["v"][str(g)])


def predicted_with_prefill(row: dict, parts: list[dict]) -> float | None:
    """The same with each request's prefill counted (``predicted_serving_speedup``), at the row's own mean answer
    length; None where the costs have no prefill (files from before it was measured)."""
    from specops.engine.gamma import predicted_serving_speedup

    p = _costs_for(row, parts)
    if p is None or "prefill" not in p or not row.get("requests_per_s"):
        return None
    g = row["gamma"]
    return predicted_serving_speedup(row["acceptance"]["mean_acceptance_length"], g, p["c"], p["v"][str(g)],
                                     p["prefill"], row["output_tokens_per_s"] / row["requests_per_s"],
                                     row["concurrency"])


def mean(r: dict, metric: str) -> float | None:
    return (r.get(f"{metric}_ms") or {}).get("mean")


def grid_table(rows: list[dict], parts: list[dict]) -> list[dict]:
    """The grid's rows with the prediction next to the measurement. E/(γc + v) models decoding alone, so besides the
    throughput speedup each row has the decode speedup (mean TPOT of γ = 0 over its own: what the formula
    predicts), the prediction with each request's prefill counted (the device time speculation does not shorten)
    and the share of a request's time spent before its first token (prefill and queueing)."""
    plain = {(r["temperature"], r["concurrency"]): r for r in rows if r["gamma"] == 0}
    out = []
    for r in rows:
        sp = r.get("speedup_throughput") or {}
        a = r.get("acceptance") or {}
        pred, pred_prefill = predicted(r, parts), predicted_with_prefill(r, parts)
        meas = sp.get("value")
        base = plain.get((r["temperature"], r["concurrency"]))
        tpot, tpot0 = mean(r, "tpot"), base and mean(base, "tpot")
        decode = tpot0 / tpot if tpot and tpot0 and r["gamma"] != 0 else None
        ttft, e2e = mean(r, "ttft"), mean(r, "e2el")
        out.append({
            "temperature": r["temperature"], "concurrency": r["concurrency"], "gamma": r["gamma"],
            "output_tokens_per_s": r["output_tokens_per_s"],
            **{f"{k}_p{q}": (r.get(f"{k}_ms") or {}).get(f"p{q}") for k in ("ttft", "tpot", "e2el") for q in (50, 99)},
            "acceptance_rate": a.get("acceptance_rate"), "mean_acceptance_length": a.get("mean_acceptance_length"),
            "speedup": meas, "speedup_ci95": [sp.get("ci95_low"), sp.get("ci95_high")],
            "goodput_rps": r["goodput_rps"], "predicted_speedup": pred,
            "measured_over_predicted": meas / pred if meas and pred else None,
            "predicted_with_prefill": pred_prefill,
            "measured_over_predicted_with_prefill": meas / pred_prefill if meas and pred_prefill else None,
            "decode_speedup": decode, "decode_over_predicted": decode / pred if decode and pred else None,
            "ttft_share": ttft / e2e if ttft and e2e else None,
            "in_flight_mean": r.get("in_flight_mean"),  # older files: absent
        })
    return out


def schedule_sweeps(runs: dict, work: Path):
    """(the stage's record of a schedule sweep, its measured configurations) for each sweep that measured any."""
    for info in runs.values():
        path = work / info.get("run", "-") / "results.json"
        if path.is_file():
            yield info, json.loads(path.read_text())["configurations"]


SIDE_BY_SIDE = {"same server": "measured in turn on one server", "same run": "measured side by side"}


def schedule_table(grid: list[dict], runs: dict, work: Path) -> list[dict]:
    """Per temperature and concurrency: the schedule's goodput against the best fixed γ of the grid, as measured
    again in the schedule's own sweep (``peer``: "same server", or "same run" for sweeps from before
    ``--one-server``, with the throughput ratio's 95 % CI over repeats), or the grid's figure where that sweep has
    none (runs from before it measured its peers). Where the schedule runs that same γ at every batch size up to
    the concurrency, the two are one configuration (``same_configuration``): their ratio is the measurement's noise
    (on one server, or between two for sweeps from before ``--one-server``), not the schedule's doing."""
    from specops.bench.latency import ratio_ci
    from specops.engine.config import gamma_at

    out = []
    for info, measured in schedule_sweeps(runs, work):
        for r in (r for r in measured if r["gamma"] == "schedule"):
            best = best_fixed(grid, r["temperature"], r["concurrency"])
            peer = best and next((p for p in measured if p["gamma"] == best["gamma"] and p["concurrency"] ==
                                  r["concurrency"] and p["temperature"] == r["temperature"]), None)
            ref = peer or best
            _, lo, hi = ratio_ci(r.get("output_tokens_per_s_repeats", []),
                                 peer.get("output_tokens_per_s_repeats", []) if peer else [])
            out.append({"temperature": r["temperature"], "concurrency": r["concurrency"],
                        "schedule_goodput_rps": r["goodput_rps"],
                        "schedule_output_tokens_per_s": r["output_tokens_per_s"],
                        "best_fixed_gamma": best and best["gamma"],
                        "best_fixed_goodput_rps": ref and ref["goodput_rps"],
                        "peer": ("same server" if info.get("one_server") else "same run") if peer else "grid",
                        "same_configuration": best is not None and all(
                            gamma_at(info["schedule"], b) == best["gamma"] for b in range(1, r["concurrency"] + 1)),
                        "goodput_vs_best_fixed": r["goodput_rps"] / ref["goodput_rps"]
                        if ref and ref["goodput_rps"] else None,
                        "throughput_ratio_ci95": [lo, hi]})
    return out


def server_spread(grid: list[dict], runs: dict, work: Path) -> list[dict]:
    """Each fixed γ that a schedule sweep measured again, against the grid's figure for it: one configuration on two
    servers of the same settings. Their ratio is the spread the repeats of one server leave out of every CI, and
    the yardstick for any ratio between two servers (the schedule's against its peer's)."""
    at = {(r["temperature"], r["concurrency"], r["gamma"]): r for r in grid}
    out = []
    for _, measured in schedule_sweeps(runs, work):
        for r in measured:
            g = at.get((r["temperature"], r["concurrency"], r["gamma"]))
            if g is not None and g["output_tokens_per_s"]:
                out.append({"temperature": r["temperature"], "concurrency": r["concurrency"], "gamma": r["gamma"],
                            "grid_output_tokens_per_s": g["output_tokens_per_s"],
                            "again_output_tokens_per_s": r["output_tokens_per_s"],
                            "ratio": r["output_tokens_per_s"] / g["output_tokens_per_s"]})
    return out


def fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_tables(doc: dict) -> None:
    m = doc.get("models") or {}
    if m:
        t = m["target"]
        print(f"\ntarget: {m['parameters'] / 1e6:.1f} M parameters, trained in {m['seconds']:.0f} s on {m['device']}; "
              f"held-out ({m['heldout']}): schema-valid {t['valid_rate']:.3f}, field accuracy {t['field_accuracy']:.3f}")
    d = doc.get("draft") or {}
    after = (d.get("acceptance") or {}).get("after")
    if after:
        print(f"draft: trained in {d.get('seconds', 0):.0f} s; held-out acceptance {after['acceptance_rate']:.3f}, "
              f"mean acceptance length {after['mean_acceptance_length']:.2f} at γ = {after['gamma']}")
    if doc.get("costs"):
        print("\nstep costs (relative to a plain 1-token step at the same batch size)")
        print(f"{'T':<4}{'batch':>5} {'plain ms':>9} {'c':>6} "
              + " ".join(f"{'v(' + g + ')':>7}" for g in doc["costs"][0]["v"]))
        for p in doc["costs"]:
            print(f"{p.get('temperature', 0.0):<4g}{p['batch']:>5} {p['target_ms']:>9.3f} {p['c']:>6.3f} "
                  + " ".join(f"{v:>7.3f}" for v in p["v"].values()))
    if doc.get("grid"):
        print("\nT    c  γ    tok/s  TTFT p50/p99 ms  TPOT p50/p99 ms   E2E p50/p99 ms  acc   MAL  speedup [95% CI]"
              "       goodput  pred  meas/pred  +prefill  meas/+prefill  decode  dec/pred  TTFT share  in flight")
        for r in doc["grid"]:
            lo, hi = r["speedup_ci95"]
            print(f"{r['temperature']:<4g}{r['concurrency']:>3} {r['gamma']!s:>2} {r['output_tokens_per_s']:>8.1f} "
                  f"{fmt(r['ttft_p50'], '7.1f')}/{fmt(r['ttft_p99'], '<7.1f')} "
                  f"{fmt(r['tpot_p50'], '7.2f')}/{fmt(r['tpot_p99'], '<7.2f')} "
                  f"{fmt(r['e2el_p50'], '7.0f')}/{fmt(r['e2el_p99'], '<7.0f')} "
                  f"{fmt(r['acceptance_rate'], '.3f'):>5} {fmt(r['mean_acceptance_length']):>5} "
                  f"{fmt(r['speedup'], '5.2f')} [{fmt(lo)}, {fmt(hi)}] {r['goodput_rps']:>8.2f} "
                  f"{fmt(r['predicted_speedup']):>5} {fmt(r['measured_over_predicted']):>9} "
                  f"{fmt(r.get('predicted_with_prefill')):>9} {fmt(r.get('measured_over_predicted_with_prefill')):>14} "
                  f"{fmt(r['decode_speedup']):>7} {fmt(r['decode_over_predicted']):>9} {fmt(r['ttft_share']):>11} "
                  f"{fmt(r.get('in_flight_mean'), '.1f'):>10}")
    if doc.get("schedule"):
        print("\nschedule (recommended γ per batch size) against the best fixed γ, goodput under the SLO")
        for r in doc["schedule"]:
            print(f"T {r['temperature']:g} c {r['concurrency']:>3}: schedule {r['schedule_goodput_rps']:.2f} rps, "
                  f"best fixed γ={r['best_fixed_gamma']} {fmt(r['best_fixed_goodput_rps'])} rps, "
                  f"ratio {fmt(r['goodput_vs_best_fixed'], '.3f')}"
                  + (" [{}, {}]".format(*(fmt(x, ".3f") for x in r["throughput_ratio_ci95"]))
                     if r.get("throughput_ratio_ci95", [None])[0] is not None else "")
                  + f" ({SIDE_BY_SIDE.get(r.get('peer'), 'against the grid')}"
                  + ("; the same configuration" if r.get("same_configuration") else "") + ")")
    spread = [r["ratio"] for r in doc.get("server_spread") or []]
    if spread:
        print(f"one configuration on two servers (a schedule sweep's over the grid's, {len(spread)} points): "
              f"{min(spread):.3f} to {max(spread):.3f} of the output tok/s")


def main() -> int:
    # Ctrl-C and SIGTERM stop the run the same way: the running sweep exports what it finished, study.json is
    # written. Set explicitly because a job started in the background inherits SIGINT ignored, and so would the
    # sweep, which then could not be interrupted at the time limit either.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = parse()
    args.work = args.work.resolve()
    out = (args.out or Path(os.environ.get("OUT") or args.work)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    recipe, draft, s = settings(args)
    doc: dict = {"command": " ".join(sys.argv), "tiny": args.tiny, "host": host(),
                 "settings": {"draft": draft, "sweep": s}}
    status = {}
    try:
        doc["models"] = stage_models(args, recipe)
        doc["draft"] = stage_draft(args, recipe, draft)
        prompts = write_prompts(args, recipe)
        temperatures = ",".join(f"{t:g}" for t in s["temperatures"])
        first = [g for g in s["gammas"] if g in FIRST_GAMMAS]  # the goals' points, so a short run still has them
        passes = [first, s["gammas"]] if first and first != s["gammas"] else [s["gammas"]]
        for i, gammas in enumerate(passes):
            grid_done = sweep(args, s, args.work / "grid", prompts, ",".join(map(str, gammas)), temperatures,
                              s["repeats"])
            if i == 0:
                measure_costs(args, s, doc)
            if not grid_done:
                break
        status["grid"] = "complete" if grid_done else "partial"
        if grid_done:
            doc["schedule_runs"] = {}
            stage_schedule(args, s, prompts, doc["schedule_runs"])
            status["schedule"] = "complete" if all(v.get("complete", True) for v in doc["schedule_runs"].values()) \
                and len(doc["schedule_runs"]) == len(s["temperatures"]) else "partial"
    except KeyboardInterrupt:
        log("stopped: writing what is done")
        status["stopped"] = True
    finally:
        results = args.work / "grid" / "results.json"
        if results.is_file():
            rows = json.loads(results.read_text())["configurations"]
            doc["grid"] = grid_table(rows, doc.get("costs") or [])
            doc["schedule"] = schedule_table(doc["grid"], doc.get("schedule_runs", {}), args.work)
            doc["server_spread"] = server_spread(doc["grid"], doc.get("schedule_runs", {}), args.work)
            for name in ("results.json", "results.csv", "recommendation.json"):
                if (args.work / "grid" / name).is_file():
                    shutil.copy(args.work / "grid" / name, out / name)
            for run in doc.get("schedule_runs", {}).values():
                if "run" in run and (args.work / run["run"] / "results.json").is_file():
                    shutil.copy(args.work / run["run"] / "results.json", out / f"{run['run']}.json")
        doc["status"] = status
        doc["seconds"] = round(time.monotonic() - START, 1)
        (out / "study.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print_tables(doc)
        log(f"wrote {out / 'study.json'}; status {status}")
    return 0 if status.get("schedule") == "complete" else 3


if __name__ == "__main__":
    sys.exit(main())
