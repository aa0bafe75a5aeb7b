"""The sweep: for each (drafter, γ) start one server, measure every pending concurrency × temperature × repeat point against
it, commit each point as it finishes, then export results and the recommendation. With ``--one-server`` a single
embedded server measures every γ, its γ table switched between points (``POST /admin/gamma-schedule``).

Per point: warm-up requests (not measured), a scrape of the speculative counters, the timed requests, a second
scrape; acceptance is the difference, so it covers exactly the timed requests.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specops.backends.scrape import scrape_spec
from specops.bench import loadgen, workload
from specops.bench.config import SweepConfig
from specops.bench.recommend import recommend
from specops.bench.results import export
from specops.bench.servers import preflight, serving, stop_stale
from specops.bench.store import Point, RunStore, StoredConfig, speculative
from specops.bench.table import print_recommendation, print_summary
from specops.errors import SpecopsError
from specops.files import write_atomic


def load_prompts(cfg: SweepConfig) -> list[workload.Prompt]:
    if cfg.dataset is not None:
        return workload.from_dataset(Path(cfg.dataset))
    return workload.synthetic(cfg.synthetic, cfg.seed)


def _spec(server, required: bool):
    try:
        return scrape_spec(server.base_url, server.api_key)
    except SpecopsError:
        if required:
            raise
        return None  # an external server without /metrics: no acceptance figures


def measure(server, cfg: SweepConfig, point: Point, pool: list[workload.Prompt], on_progress=None) -> StoredConfig:
    """Run one configuration against a running server."""
    spec = loadgen.LoadSpec(base_url=server.base_url, model=server.model_name, concurrency=point.concurrency,
                            temperature=point.temperature, max_tokens=cfg.max_tokens, rate=cfg.rate, seed=cfg.seed,
                            api_key=server.api_key, top_p=cfg.top_p, ignore_eos=cfg.ignore_eos, provenance=cfg.provenance,
                            timeout_s=cfg.request_timeout_s, response_format=cfg.response_format,
                            procs=cfg.client_procs)
    if cfg.warmup:  # it warms the server, not the load generator: one client process, not a spawn of several
        warm = loadgen.run(workload.ordered(pool, cfg.warmup, cfg.seed + 1), replace(spec, procs=1))
        if not any(r.ok for r in warm.records):
            raise SpecopsError(f"every warm-up request failed at {_label(point)}: {warm.records[0].error}")
    timed = workload.ordered(pool, cfg.timed_requests(point.concurrency), cfg.seed)
    counts = speculative(point.gamma) or point.drafter != "eagle3" or cfg.backend == "external"
    before = _spec(server, cfg.backend != "external") if counts else None
    result = loadgen.run(timed, spec, on_progress)
    after = _spec(server, cfg.backend != "external") if before is not None else None
    if not any(r.ok for r in result.records):
        raise SpecopsError(f"every request failed at {_label(point)}: {result.records[0].error}")
    counters = None
    if after is not None and (speculative(point.gamma) or point.drafter != "eagle3" or after.num_drafts > 0):
        counters = after.since(before).counters()
    return StoredConfig(point, result.duration_s, counters, result.records)


def use_gamma_table(server, table) -> None:
    """Have a server started with ``--gamma-endpoint`` draft by ``table`` from its next request on."""
    url = server.base_url.removesuffix("/v1") + "/admin/gamma-schedule"
    headers = {"Content-Type": "application/json"}
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    body = json.dumps({"gamma_schedule": [list(r) for r in table]}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=600) as resp:
            resp.read()
    except urllib.error.HTTPError as e:
        raise SpecopsError(f"the server refused γ table {list(map(list, table))}: {e.read().decode(errors='replace')}"
                           ) from None
    except OSError as e:
        raise SpecopsError(f"could not switch the server's γ table ({url}): {e}") from None


def _label(p: Point) -> str:
    drafter = f"drafter={p.drafter} " if p.drafter != "eagle3" else ""
    return f"{drafter}γ={p.gamma} concurrency={p.concurrency} temperature={p.temperature:g} repeat={p.repeat}"


def run_sweep(cfg: SweepConfig, console: Optional[Console] = None, tables: Optional[Console] = None) -> Path:
    """Measure every configuration of ``cfg``'s grid not yet in the run directory; returns the run directory.
    Progress goes to ``console`` (stderr), the summary and recommendation tables to ``tables`` (stdout)."""
    console = console or Console(stderr=True)
    tables = tables or Console(width=None if sys.stdout.isatty() else 200)
    cfg.validate()
    pool = load_prompts(cfg)
    preflight(cfg)
    out = Path(cfg.out)
    store = RunStore.open(out, cfg.fixed(), cfg.resume)
    try:
        _measure_pending(cfg, store, pool, console)
    finally:  # an interrupted or failed sweep still exports what it finished
        configs = store.configs()
        doc = export(out, store.fixed(), configs, cfg.slo, cfg.gpu_hourly_cost, cfg.gpus) if configs else None
        store.close()
        if doc is not None:
            rec = recommend(doc["configurations"], doc["fixed"].get("draft"))
            write_atomic(out / "recommendation.json", json.dumps(rec, indent=2, ensure_ascii=False) + "\n")
    print_summary(doc["configurations"], cost=cfg.gpu_hourly_cost is not None, console=tables,
                  closed_loop=cfg.rate is None)
    print_recommendation(rec, console=tables)
    return out


def _measure_pending(cfg: SweepConfig, store: RunStore, pool: list[workload.Prompt], console: Console) -> None:
    if stop_stale(Path(cfg.out)):
        console.print("stopped a server left running by an interrupted sweep of this run")
    points = cfg.points()
    done = store.done_keys()
    pending = [p for p in points if p.key not in done]
    if len(points) > len(pending):
        console.print(f"resuming: {len(points) - len(pending)} of {len(points)} configurations already measured")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console) as bar:
        grid = bar.add_task("configurations", total=len(points), completed=len(points) - len(pending), note="")
        reqs = bar.add_task("requests", total=cfg.num_prompts, note="")
        for drafter, gamma in cfg.servers():
            todo = [p for p in pending if cfg.one_server or (p.drafter, p.gamma) == (drafter, gamma)]
            if not todo:
                continue
            bar.update(grid, note=f"starting server drafter={drafter} γ={gamma}")
            started = time.perf_counter()
            with serving(cfg, gamma, drafter) as server:
                console.print(f"server drafter={drafter} γ={gamma} ready in {time.perf_counter() - started:.1f} s"
                              + (f", switching between γ {','.join(map(str, cfg.gammas))}" if cfg.one_server else ""))
                table = None
                for p in todo:
                    if cfg.one_server and cfg.gamma_table(p.gamma) != table:
                        table = cfg.gamma_table(p.gamma)
                        use_gamma_table(server, table)
                    bar.update(grid, note=_label(p))
                    bar.reset(reqs, total=cfg.timed_requests(p.concurrency))
                    on_progress = lambda n_in, n_done: bar.update(  # noqa: E731
                        reqs, completed=n_done, note=f"{n_in} in flight")
                    store.commit(measure(server, cfg, p, pool, on_progress))
                    bar.advance(grid)


def run_bench(cfg: SweepConfig) -> dict[str, Any]:
    """One configuration (single γ, concurrency and temperature); without ``cfg.out`` the run directory is temporary.
    Returns its grid row."""
    cfg.validate()
    if len(cfg.points()) != 1:
        raise SpecopsError("bench measures one configuration: one drafter, γ, concurrency and temperature")
    with tempfile.TemporaryDirectory(prefix="specops-bench-") as tmp:
        if cfg.out is None:
            cfg.out = Path(tmp)
        out = run_sweep(cfg, tables=Console(stderr=True))
        doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return doc["configurations"][0]
