"""From stored configurations to result tables: per run, per grid point (over repeats), speedups, cost.

Everything here is derived from the raw records and counters in the store, so exporting again with another SLO
or GPU price needs no new measurement. Rates are means over repeats; latency distributions pool the repeats'
requests; acceptance sums the repeats' counters.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

from specops.bench.latency import PERCENTILE_METHOD, SPEEDUP_CI_METHOD, distribution, ratio_ci, summarize, tpot_s
from specops.bench.store import StoredConfig, gamma_order, speculative
from specops.engine.stats import SpecStats
from specops.files import write_atomic

MEANS = ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "goodput_rps", "slo_attainment",
         "in_flight_mean")
DISTS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def acceptance(spec: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The stored counters with vLLM's rates: accepted/draft tokens, 1 + accepted/drafts, per position /drafts."""
    return None if spec is None else SpecStats.from_dict(spec).to_dict(per_position=True)


def run_row(cfg: StoredConfig, slo_s: dict[str, float]) -> dict[str, Any]:
    p = cfg.point
    return {"key": p.key, "drafter": p.drafter, "gamma": p.gamma, "concurrency": p.concurrency,
            "temperature": p.temperature, "repeat": p.repeat, **summarize(cfg.records, cfg.duration_s, slo_s), "acceptance": acceptance(cfg.spec)}


def _sum_spec(specs: list[Optional[dict]]) -> Optional[dict]:
    if not specs or any(s is None for s in specs):
        return None
    total = SpecStats()
    for s in specs:
        total.merge(SpecStats.from_dict(s))
    return total.counters()


def _ci(value: tuple) -> Optional[dict[str, Optional[float]]]:
    ratio, lo, hi = value
    return None if ratio is None else {"value": ratio, "ci95_low": lo, "ci95_high": hi}


def cost_per_mtok(tokens_per_s: float, hourly_usd: Optional[float], gpus: int) -> Optional[float]:
    """USD per million output tokens at the measured throughput, paying for ``gpus`` GPUs by the hour."""
    if hourly_usd is None or tokens_per_s <= 0:
        return None
    return hourly_usd * gpus / 3600.0 / tokens_per_s * 1e6


def grid_rows(configs: list[StoredConfig], slo_s: dict[str, float], hourly_usd: Optional[float] = None,
              gpus: int = 1) -> list[dict[str, Any]]:
    """One row per (drafter, γ, concurrency, temperature), with speedups against plain decoding (γ = 0 with the
    eagle3 drafter, i.e. no drafts) at the same load and temperature."""
    groups: dict[tuple, list[StoredConfig]] = defaultdict(list)
    for c in configs:
        groups[(c.point.drafter, c.point.gamma, c.point.concurrency, c.point.temperature)].append(c)
    runs = {k: [run_row(c, slo_s) for c in v] for k, v in groups.items()}
    rows = []
    order = lambda kv: (kv[0][3], kv[0][2], kv[0][0] != "eagle3", kv[0][0], gamma_order(kv[0][1]))  # noqa: E731
    for (drafter, g, conc, temp), rs in sorted(runs.items(), key=order):
        group = groups[(drafter, g, conc, temp)]
        done = [r for c in group for r in c.records if r.ok]
        row: dict[str, Any] = {"drafter": drafter, "gamma": g, "concurrency": conc, "temperature": temp, "repeats": len(rs),
                               "requests": sum(r["requests"] for r in rs), "completed": sum(r["completed"] for r in rs),
                               "errors": sum(r["errors"] for r in rs)}
        row.update({k: sum(r[k] for r in rs) / len(rs) for k in MEANS})
        row["output_tokens_per_s_repeats"] = [r["output_tokens_per_s"] for r in rs]
        row["ttft_ms"] = distribution(r.ttft_s for r in done if r.ttft_s is not None)
        row["tpot_ms"] = distribution(t for t in map(tpot_s, done) if t is not None)
        row["itl_ms"] = distribution(x for r in done for x in r.itl_s)
        row["e2el_ms"] = distribution(r.e2e_s for r in done)
        drafts = speculative(g) or drafter != "eagle3"
        row["acceptance"] = acceptance(_sum_spec([c.spec for c in group])) if drafts else None
        base = runs.get(("eagle3", 0, conc, temp))
        if base is not None:
            row["speedup_throughput"] = _ci(ratio_ci([r["output_tokens_per_s"] for r in rs],
                                                     [r["output_tokens_per_s"] for r in base]))
            lat = lambda rr: [r["e2el_ms"]["mean"] for r in rr if r["e2el_ms"]]  # noqa: E731
            row["speedup_latency"] = _ci(ratio_ci(lat(base), lat(rs)))
        else:
            row["speedup_throughput"] = row["speedup_latency"] = None
        row["output_tokens_per_s_per_gpu"] = row["output_tokens_per_s"] / gpus
        row["usd_per_million_output_tokens"] = cost_per_mtok(row["output_tokens_per_s"], hourly_usd, gpus)
        rows.append(row)
    return rows


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """A CSV-ready row: nested distributions and intervals spread into columns, lists joined by ';', absent
    values (no acceptance at γ = 0, no cost without a price) left out so their cells stay empty."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v is None:
            continue
        if isinstance(v, dict):
            for kk, vv in flat(v).items():
                out[f"{k}_{kk}"] = vv
        elif isinstance(v, list):
            out[k] = ";".join(f"{x:.6g}" if isinstance(x, float) else str(x) for x in v)
        else:
            out[k] = v
    return out


def export(out_dir: Path, fixed: dict, configs: list[StoredConfig], slo_s: dict[str, float],
           hourly_usd: Optional[float], gpus: int) -> dict[str, Any]:
    """Write results.json (every run and grid point) and results.csv (grid points); returns the JSON object."""
    rows = grid_rows(configs, slo_s, hourly_usd, gpus)
    doc = {
        "fixed": fixed,
        "slo_ms": {k: v * 1000 for k, v in slo_s.items()},
        "cost": {"gpu_hourly_usd": hourly_usd, "gpus": gpus} if hourly_usd is not None else None,
        "percentile_method": PERCENTILE_METHOD,
        "speedup_method": SPEEDUP_CI_METHOD,
        "configurations": rows,
        "runs": [run_row(c, slo_s) for c in configs],
    }
    write_atomic(out_dir / "results.json", json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    flats = [flat({k: v for k, v in r.items() if k != "output_tokens_per_s_repeats"}) for r in rows]
    columns = list(dict.fromkeys(k for f in flats for k in f))
    table = io.StringIO(newline="")
    w = csv.DictWriter(table, fieldnames=columns)
    w.writeheader()
    w.writerows(flats)
    write_atomic(out_dir / "results.csv", table.getvalue())
    return doc
