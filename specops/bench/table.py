"""The end-of-sweep summary and recommendation, printed as rich tables on stdout."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Console
from rich.table import Table


def _num(x: Optional[float], fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def _speedup(s: Optional[dict]) -> str:
    if not s or s["value"] is None:
        return "–"
    ci = f" [{s['ci95_low']:.2f}, {s['ci95_high']:.2f}]" if s["ci95_low"] is not None else ""
    return f"{s['value']:.2f}×{ci}"


def _p(d: Optional[dict], key: str) -> str:
    return _num(d[key] if d else None, "{:.0f}")


SHORTFALL = 0.9  # in flight below this share of the concurrency: the client, not the server, set part of the pace


def print_summary(rows: list[dict[str, Any]], cost: bool, console: Optional[Console] = None,
                  closed_loop: bool = True) -> None:
    """The grid's rows; with ``closed_loop`` (no arrival rate), a warning for every point where the load generator
    kept fewer requests in flight than its concurrency, whose throughput then understates the server's."""
    console = console or Console()
    t = Table(title="sweep summary (latencies in ms)")
    drafters = any(r.get("drafter", "eagle3") != "eagle3" for r in rows)
    for col in ("T", "conc", *(("drafter",) if drafters else ()), "γ", "req/s", "out tok/s", "goodput", "SLO %", "TTFT p50", "TPOT p50", "E2E p50",
                "E2E p99", "accept", "len", "speedup ×tput [95% CI]", "errors"):
        t.add_column(col, justify="right")
    if cost:
        t.add_column("$/Mtok", justify="right")
    for r in rows:
        acc = r.get("acceptance") or {}
        cells = [f"{r['temperature']:g}", str(r["concurrency"]), *((r["drafter"],) if drafters else ()), str(r["gamma"]), _num(r["requests_per_s"], "{:.2f}"),
                 _num(r["output_tokens_per_s"]), _num(r["goodput_rps"], "{:.2f}"),
                 _num(100 * r["slo_attainment"], "{:.0f}"), _p(r["ttft_ms"], "p50"), _p(r["tpot_ms"], "p50"),
                 _p(r["e2el_ms"], "p50"), _p(r["e2el_ms"], "p99"), _num(acc.get("acceptance_rate"), "{:.2f}"),
                 _num(acc.get("mean_acceptance_length"), "{:.2f}"), _speedup(r.get("speedup_throughput")),
                 str(r["errors"])]
        if cost:
            cells.append(_num(r["usd_per_million_output_tokens"], "{:.2f}"))
        s = (r.get("speedup_throughput") or {}).get("value")
        t.add_row(*cells, style="red" if s is not None and s < 1 else None)
    console.print(t)
    short = [r for r in rows if closed_loop and r.get("in_flight_mean") is not None
             and r["in_flight_mean"] < SHORTFALL * min(r["concurrency"], r["requests"] / r["repeats"])]
    for r in short:
        console.print(f"[yellow]warning[/yellow]: γ={r['gamma']} at concurrency {r['concurrency']} and temperature "
                      f"{r['temperature']:g} kept {r['in_flight_mean']:.1f} requests in flight on average: the load "
                      f"generator fell short, so its throughput understates the server's")


def print_recommendation(rec: dict[str, Any], console: Optional[Console] = None) -> None:
    console = console or Console()
    for block in rec["by_temperature"]:
        t = Table(title=f"recommended γ at temperature {block['temperature']:g}")
        for col in ("concurrency", "γ", "by", "best γ goodput", "best γ throughput"):
            t.add_column(col, justify="right")
        for lv in block["levels"]:
            t.add_row(str(lv["concurrency"]), str(lv["gamma"]), lv["chosen_by"], str(lv["best_gamma_goodput"]),
                      str(lv["best_gamma_throughput"]))
        console.print(t)
        for reg in block["regressions"]:
            console.print(f"[red]regression[/red]: γ={reg['gamma']} at concurrency {reg['concurrency']} runs at "
                          f"{reg['speedup']:.2f}× the throughput of γ=0")
        for d in block.get("drafters", []):
            console.print(f"{d['drafter']} (γ={d['gamma']}) at concurrency {d['concurrency']}: "
                          f"{_num(d['goodput_vs_eagle3'], '{:.2f}')}× the goodput and "
                          f"{_num(d['throughput_vs_eagle3'], '{:.2f}')}× the throughput of the best fixed-γ eagle3 "
                          f"configuration (γ={d['eagle3_gamma']})")
        for note in block["notes"]:
            console.print(f"note: {note}")
        console.print(f"vLLM: {block['vllm']['cli']}", soft_wrap=True)
