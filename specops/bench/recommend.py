"""Which γ to deploy at each load level, from the sweep's grid rows.

Per temperature and concurrency the best γ is the one with the most goodput (ties: more output tokens/s); where
no configuration met the SLO the choice falls back to throughput and says so. Every γ > 0 whose throughput
speedup over γ = 0 is below 1 is flagged as a regression. The deployable form is vLLM's batch-size schedule
``num_speculative_tokens_per_batch_size: [[start_bs, end_bs, K], ...]`` (inclusive ranges starting at 1):
the concurrency level c_i covers batch sizes (c_{i-1}, c_i], adjacent levels with the same γ merge, and vLLM
carries the last K beyond the largest level measured. That schedule is chosen among the EAGLE-3 rows of fixed γ;
rows of other drafters (schema-aware drafting), of ``--gamma auto`` and of ``--gamma schedule`` are compared with it
per level: the best of each next to the best fixed-γ EAGLE-3 configuration.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from specops.bench.store import NAMED_GAMMAS, gamma_order


def best(rows: list[dict], key) -> dict:
    """The row with the highest ``key``, ties broken by throughput, then by the smaller γ."""
    return max(rows, key=lambda r: (key(r), r["output_tokens_per_s"], -gamma_order(r["gamma"])))


def schedule(levels: list[tuple[int, int]]) -> list[list[int]]:
    """[(concurrency, γ), ...] → merged inclusive batch-size ranges [[start, end, γ], ...] covering 1..max."""
    out: list[list[int]] = []
    prev = 0
    for conc, gamma in sorted(levels):
        if out and out[-1][2] == gamma:
            out[-1][1] = conc
        else:
            out.append([prev + 1, conc, gamma])
        prev = conc
    return out


def vllm_speculative_config(ranges: list[list[int]], draft: Optional[str]) -> Optional[dict[str, Any]]:
    """The ``--speculative-config`` object, or None when no load level gains from speculation."""
    top = max(k for _, _, k in ranges)
    if top == 0:
        return None
    return {"method": "eagle3", "model": draft or "DRAFT_DIR", "num_speculative_tokens": top,
            "num_speculative_tokens_per_batch_size": ranges}


def _temperature(t: float, rows: list[dict], draft: Optional[str]) -> dict[str, Any]:
    if not rows:  # a run of schedules or auto alone: nothing to choose a schedule from
        return {"temperature": t, "levels": [], "regressions": [], "notes": ["no fixed-γ EAGLE-3 configuration measured"],
                "vllm": {"speculative_config": None, "cli": "(measure fixed γ values to get one)"},
                "embedded": {"gamma_per_batch_size": None}}
    levels, notes = [], []
    for conc in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == conc]
        by_goodput = best(at, lambda r: r["goodput_rps"])
        by_throughput = best(at, lambda r: r["output_tokens_per_s"])
        met = by_goodput["goodput_rps"] > 0
        if not met:
            notes.append(f"no configuration met the SLO at concurrency {conc}; chosen by throughput")
        chosen = by_goodput if met else by_throughput
        levels.append({"concurrency": conc, "gamma": chosen["gamma"], "chosen_by": "goodput" if met else "throughput",
                       "best_gamma_goodput": by_goodput["gamma"], "goodput_rps": by_goodput["goodput_rps"],
                       "best_gamma_throughput": by_throughput["gamma"],
                       "output_tokens_per_s": by_throughput["output_tokens_per_s"],
                       "speedup_throughput": (chosen.get("speedup_throughput") or {}).get("value")})
    regressions = []
    for r in rows:
        s = r.get("speedup_throughput")
        if r["gamma"] > 0 and s and s["value"] is not None and s["value"] < 1:
            regressions.append({"gamma": r["gamma"], "concurrency": r["concurrency"], "speedup": s["value"],
                                "ci95": [s["ci95_low"], s["ci95_high"]],
                                "significant": s["ci95_high"] is not None and s["ci95_high"] < 1})
    ranges = schedule([(lv["concurrency"], lv["gamma"]) for lv in levels])
    spec = vllm_speculative_config(ranges, draft)
    return {
        "temperature": t,
        "levels": levels,
        "regressions": sorted(regressions, key=lambda x: (x["concurrency"], x["gamma"])),
        "notes": notes,
        "vllm": {"speculative_config": spec,
                 "cli": f"--speculative-config '{json.dumps(spec)}'" if spec else "(no speculation: leave it off)"},
        "embedded": {"gamma_per_batch_size": ranges},
    }


def _kind(r: dict) -> str:
    """eagle3 (fixed γ), a schema drafter's name, or with the engine's γ "eagle3 auto" / "eagle3 schedule" (rows
    from before the drafter axis: eagle3)."""
    drafter = r.get("drafter", "eagle3")
    return f"{drafter} {r['gamma']}" if r["gamma"] in NAMED_GAMMAS else drafter


def drafter_levels(rows: list[dict]) -> list[dict[str, Any]]:
    """Per concurrency: the best configuration of each drafter, of γ = auto and of γ = schedule (by goodput, then
    throughput) against the best fixed-γ EAGLE-3 one, by goodput and by throughput."""
    out = []
    for conc in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == conc]
        fixed = [r for r in at if _kind(r) == "eagle3"]
        if not fixed:
            continue  # nothing to compare with at this level
        base = best(fixed, lambda r: r["goodput_rps"])
        for name in sorted({_kind(r) for r in at} - {"eagle3"}):
            top = best([r for r in at if _kind(r) == name], lambda r: r["goodput_rps"])
            out.append({"concurrency": conc, "drafter": name, "gamma": top["gamma"],
                        "output_tokens_per_s": top["output_tokens_per_s"], "eagle3_gamma": base["gamma"],
                        "eagle3_output_tokens_per_s": base["output_tokens_per_s"],
                        "throughput_vs_eagle3": top["output_tokens_per_s"] / base["output_tokens_per_s"]
                        if base["output_tokens_per_s"] else None,
                        "goodput_vs_eagle3": top["goodput_rps"] / base["goodput_rps"] if base["goodput_rps"] else None})
    return out


def recommend(rows: list[dict], draft: Optional[str] = None) -> dict[str, Any]:
    """Recommendation per temperature from grid rows (``results.grid_rows``)."""
    temps = sorted({r["temperature"] for r in rows})
    eagle3 = [r for r in rows if _kind(r) == "eagle3"]
    blocks = []
    for t in temps:
        block = _temperature(t, [r for r in eagle3 if r["temperature"] == t], draft)
        others = drafter_levels([r for r in rows if r["temperature"] == t])
        if others:
            block["drafters"] = others
        blocks.append(block)
    return {"objective": "max goodput (requests/s meeting every SLO); ties and SLO misses by output tokens/s",
            "regression": "γ > 0 with throughput speedup over γ = 0 below 1 at the same concurrency and temperature",
            "by_temperature": blocks}
