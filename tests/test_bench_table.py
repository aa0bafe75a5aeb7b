"""The sweep's summary: a warning where the load generator kept fewer requests in flight than asked."""

from __future__ import annotations

from rich.console import Console

from specops.bench.table import print_summary


def row(conc: int, in_flight: float, requests: int = 256, gamma: int = 3) -> dict:
    dist = {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p95": 1.0, "p99": 1.0}
    return {"temperature": 0.0, "concurrency": conc, "gamma": gamma, "repeats": 2, "requests": 2 * requests,
            "requests_per_s": 10.0, "output_tokens_per_s": 1000.0, "goodput_rps": 10.0, "slo_attainment": 1.0,
            "ttft_ms": dist, "tpot_ms": dist, "e2el_ms": dist, "acceptance": None, "speedup_throughput": None,
            "errors": 0, "in_flight_mean": in_flight}


def printed(rows: list[dict], **kw) -> str:
    console = Console(record=True, width=200)
    print_summary(rows, cost=False, console=console, **kw)
    return console.export_text()


def test_a_point_whose_load_generator_fell_short_is_flagged():
    out = printed([row(1, 0.99), row(32, 29.5), row(64, 49.0, gamma=5), row(16, 5.6, requests=6)])
    warnings = [line for line in out.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1  # 29.5 of 32 is within 10 %; 5.6 of the 6 requests a run had is too
    assert "γ=5 at concurrency 64" in warnings[0] and "kept 49.0 requests in flight" in warnings[0]


def test_open_loop_runs_keep_fewer_in_flight_by_design():
    assert "warning" not in printed([row(64, 20.0)], closed_loop=False)


def test_results_from_before_the_measure_are_not_flagged():
    old = row(64, 0.0)
    del old["in_flight_mean"]
    assert "warning" not in printed([old])
