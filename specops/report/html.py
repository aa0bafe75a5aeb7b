"""``specops report RUN``: one self-contained HTML file from a study's run directory.

Everything it shows is read from the run directory (``results.json``, ``recommendation.json`` and the stage
results and metadata in ``runs.sqlite``), so a report can be rebuilt at any time without measuring again. The
file has no script, no external reference and no network request; charts are inline SVG.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from specops.errors import SpecopsError
from specops.files import write_atomic
from specops.report.svg import PALETTE, Series, bar_chart, heatmap, line_chart

CSS = """
:root{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1b1b1b;background:#fafafa}
body{max-width:1100px;margin:0 auto;padding:1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
h3{font-size:1.05rem}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:1rem}
.chart{width:100%;height:auto;background:#fff;border:1px solid #e4e4e4;border-radius:6px}
.chart .ct{font-size:14px;font-weight:600}.chart .tk{font-size:11px;fill:#444}.chart .al{font-size:12px;fill:#222}
.chart .lg{font-size:11px}.chart .ax{stroke:#888}.chart .grid{stroke:#eee}.chart .empty{font-size:14px;fill:#999}
.chart .cv{font-size:11px}.chart .hm-empty{fill:#f0f0f0}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}th{background:#f2f2f2}td.l,th.l{text-align:left}
.bad{color:#b00020;font-weight:600}.good{color:#1b7f3a;font-weight:600}
pre{background:#f2f2f2;padding:.6rem;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
.note{color:#555;font-size:.9rem}
"""


def _num(v: Any, fmt: str = "{:.3g}") -> str:
    return "–" if v is None else fmt.format(v)


def _table(head: list[str], rows: list[list[Any]], left: int = 1) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{escape(h)}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _by(rows: list[dict], temperature: float) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        if r["temperature"] == temperature:
            out.setdefault(r["gamma"], []).append(r)
    return {g: sorted(rs, key=lambda r: r["concurrency"]) for g, rs in sorted(out.items())}


def _latency_charts(rows: list[dict], temps: list[float]) -> str:
    charts = []
    for t in temps:
        by_gamma = _by(rows, t)
        charts.append(line_chart(f"Output tokens/s, T = {t:g}", "concurrency", "tokens/s",
                                 [Series(f"γ = {g}", [(r["concurrency"], r["output_tokens_per_s"]) for r in rs])
                                  for g, rs in by_gamma.items()]))
        for key, name in (("e2el_ms", "E2E latency"), ("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            series = []
            for i, (g, rs) in enumerate(by_gamma.items()):
                color = PALETTE[i % len(PALETTE)]  # p50 and p99 of one γ share its colour
                for p, dashed in (("p50", False), ("p99", True)):
                    series.append(Series(f"γ = {g} {p}", [(r["concurrency"], (r.get(key) or {}).get(p)) for r in rs],
                                         dashed=dashed, color=color))
            charts.append(line_chart(f"{name} p50 (solid) / p99 (dashed), T = {t:g}", "concurrency", "ms", series))
    return '<div class="grid2">' + "".join(charts) + "</div>"


def _speedup_heatmaps(rows: list[dict], temps: list[float]) -> str:
    charts = []
    concs = sorted({r["concurrency"] for r in rows})
    for t in temps:
        gammas = sorted({r["gamma"] for r in rows if r["gamma"] > 0 and r["temperature"] == t})
        cells = {}
        for r in rows:
            s = r.get("speedup_throughput")
            if r["temperature"] != t or r["gamma"] == 0 or not s or s.get("value") is None:
                continue
            ci = (f" [{s['ci95_low']:.2f}, {s['ci95_high']:.2f}]" if s.get("ci95_low") is not None else "")
            cells[(gammas.index(r["gamma"]), concs.index(r["concurrency"]))] = (
                s["value"], f"{s['value']:.2f}×{ci}", s["value"] < 1)
        charts.append(heatmap(f"Throughput speedup over γ = 0, T = {t:g} (bold border: regression)",
                              [f"γ = {g}" for g in gammas], [str(c) for c in concs], cells, "γ", "concurrency"))
    return '<div class="grid2">' + "".join(charts) + "</div>"


def _grid_table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        acc = r.get("acceptance") or {}
        s = r.get("speedup_throughput") or {}
        sp = s.get("value")
        cls = ' class="bad"' if sp is not None and sp < 1 else ""
        out.append([f"{r['temperature']:g}", r["concurrency"], r["gamma"], _num(r["output_tokens_per_s"], "{:.1f}"),
                    _num((r.get("ttft_ms") or {}).get("p50"), "{:.0f}"), _num((r.get("tpot_ms") or {}).get("p50"), "{:.1f}"),
                    _num((r.get("e2el_ms") or {}).get("p50"), "{:.0f}"), _num((r.get("e2el_ms") or {}).get("p99"), "{:.0f}"),
                    _num(r.get("goodput_rps"), "{:.2f}"), _num(acc.get("acceptance_rate"), "{:.2f}"),
                    _num(acc.get("mean_acceptance_length"), "{:.2f}"),
                    f"<span{cls}>{_num(sp, '{:.2f}×')}</span>", r["errors"]])
    return _table(["T", "conc", "γ", "out tok/s", "TTFT p50", "TPOT p50", "E2E p50", "E2E p99", "goodput",
                   "accept", "mean len", "speedup", "errors"], out, left=0)


def _acceptance(acc: dict) -> str:
    """Per draft: acceptance by draft position, by token class and by schema field, drafts side by side."""
    drafts = acc.get("drafts") or {}
    if not drafts:
        return '<p class="note">No acceptance analysis in this run.</p>'
    names = list(drafts)
    positions = max(len(d.get("per_position", [])) for d in drafts.values())
    charts = [bar_chart("Acceptance rate by draft position", "rate", [str(p + 1) for p in range(positions)],
                        {n: [(d.get("per_position") or [None] * positions)[p] if p < len(d.get("per_position", []))
                             else None for p in range(positions)] for n, d in drafts.items()}, y_max=1.0)]
    for key, title in (("per_class", "Acceptance rate by token class"), ("per_field", "Acceptance rate by schema field")):
        cats = sorted({c for d in drafts.values() for c in (d.get(key) or {})})
        charts.append(bar_chart(title, "rate", cats, {n: [(d.get(key) or {}).get(c) for c in cats]
                                                      for n, d in drafts.items()}, y_max=1.0))
    rows = [[escape(n), _num(d.get("acceptance_rate"), "{:.3f}"), _num(d.get("mean_acceptance_length"), "{:.2f}"),
             _num(d.get("schema_rejection_share"), "{:.1%}")] for n, d in drafts.items()]
    advice = "".join(f"<li>{escape(a)}</li>" for a in acc.get("advice", []))
    return ('<div class="grid2">' + "".join(charts) + "</div>"
            + _table(["draft", "acceptance rate", "mean acceptance length", "rejections on schema tokens"], rows)
            + (f"<ul>{advice}</ul>" if advice else "") + f'<p class="note">Drafts: {", ".join(map(escape, names))}.</p>')


def _quality(quality: dict) -> str:
    if not quality:
        return '<p class="note">No quality comparison in this run.</p>'
    rows = []
    for label, q in quality.items():
        loss = q.get("lossless") or {}
        accu = q.get("accuracy") or {}
        judge = q.get("judge") or {}
        ret = q.get("retrieval") or {}
        diff = accu.get("difference") or {}
        win = judge.get("win") or {}
        rows.append([escape(label), _num(loss.get("identical_share"), "{:.1%}"),
                     _num(diff.get("value"), "{:+.3f}") + (f" [{diff['ci95_low']:+.3f}, {diff['ci95_high']:+.3f}]"
                                                            if diff.get("ci95_low") is not None else ""),
                     f"{_num(win.get('value'), '{:.1%}')} / {_num((judge.get('tie') or {}).get('value'), '{:.1%}')} / "
                     f"{_num((judge.get('loss') or {}).get('value'), '{:.1%}')}",
                     _num(judge.get("position_bias_rate"), "{:.1%}"), _num(ret.get("overlap_at_k"), "{:.3f}")])
    return _table(["candidate vs γ = 0", "identical outputs", "field accuracy Δ [95 % CI]", "judge win / tie / loss",
                   "position bias", "retrieval overlap@k"], rows)


def _recommendation(rec: dict) -> str:
    parts = []
    for block in rec.get("by_temperature", []):
        rows = [[lv["concurrency"], lv["gamma"], lv["chosen_by"], lv["best_gamma_goodput"], lv["best_gamma_throughput"]]
                for lv in block["levels"]]
        regs = "".join(f'<li class="bad">γ = {r["gamma"]} at concurrency {r["concurrency"]}: {r["speedup"]:.2f}× '
                       f'the throughput of γ = 0</li>' for r in block["regressions"])
        notes = "".join(f"<li>{escape(n)}</li>" for n in block["notes"])
        parts.append(f"<h3>Temperature {block['temperature']:g}</h3>"
                     + _table(["concurrency", "γ", "chosen by", "best γ (goodput)", "best γ (throughput)"], rows, 0)
                     + (f"<ul>{regs}{notes}</ul>" if regs or notes else "")
                     + "<p>Per-batch-size γ table: <code>"
                     + escape(json.dumps(block["embedded"]["gamma_per_batch_size"])) + "</code></p>"
                     + f"<p>vLLM:</p><pre>{escape(block['vllm']['cli'])}</pre>")
    return "".join(parts) or '<p class="note">No recommendation.</p>'


def _kv(d: dict) -> str:
    return _table(["setting", "value"], [[escape(str(k)), escape(v if isinstance(v, str) else json.dumps(v))]
                                         for k, v in d.items()], left=2)


def render(data: dict) -> str:
    """The report page from the collected run data (see ``collect``)."""
    rows = data["results"]["configurations"]
    temps = sorted({r["temperature"] for r in rows})
    title = data.get("title") or "specops study"
    summary = "".join(f"<li>{escape(s)}</li>" for s in data.get("summary", []))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>{escape(title)}</h1>
{f"<ul>{summary}</ul>" if summary else ""}
<h2 id="speed">Speed</h2>
{_latency_charts(rows, temps)}
<h2 id="speedup">Speedup over plain decoding</h2>
{_speedup_heatmaps(rows, temps)}
{_grid_table(rows)}
<h2 id="acceptance">Acceptance</h2>
{_acceptance(data.get("acceptance") or {})}
<h2 id="quality">Quality</h2>
{_quality(data.get("quality") or {})}
<h2 id="recommendation">Recommendation</h2>
{_recommendation(data.get("recommendation") or {})}
<h2 id="setup">Configuration, versions, hardware</h2>
{_kv(data.get("config") or {})}
{_kv(data.get("environment") or {})}
<p class="note">Generated by specops from the run directory; every figure above is computed from its stored
measurements.</p>
</body></html>
"""


def collect(run_dir: Path) -> dict:
    """Everything the report shows, read from ``run_dir``."""
    from specops.bench.store import DB_NAME, RunStore

    run_dir = Path(run_dir)
    if not (run_dir / "results.json").is_file() or not (run_dir / DB_NAME).is_file():
        raise SpecopsError(f"{run_dir}: not a run directory (no results.json / {DB_NAME}); run `specops study` first")
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    rec_path = run_dir / "recommendation.json"
    store = RunStore(run_dir)
    try:
        study = store.meta("study") or {}
        data = {"results": results,
                "recommendation": json.loads(rec_path.read_text(encoding="utf-8")) if rec_path.is_file() else {},
                "quality": store.results("quality"), "acceptance": store.result("acceptance", "drafts") or {},
                "config": {**results.get("fixed", {}), **study.get("config", {})},
                "environment": store.meta("environment") or {}, "title": study.get("title"),
                "summary": (store.result("summary", "lines") or [])}
    finally:
        store.close()
    return data


def write(run_dir: Path) -> Path:
    """Write ``run_dir/report.html``; returns its path."""
    out = Path(run_dir) / "report.html"
    write_atomic(out, render(collect(run_dir)))
    return out
