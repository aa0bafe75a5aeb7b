"""Charts as inline SVG strings: line charts over concurrency, grouped bars, and a heatmap with its labels.

Hand-written so the report is one file with no script and no network: every chart scales with its container
(``viewBox``, width 100 %), so it reads on a phone, and carries a ``<title>`` for screen readers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
W, H = 640, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 36, 48


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]] = field(default_factory=list)
    dashed: bool = False
    color: str | None = None


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values spanning [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 2.5, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first, last = math.floor(lo / step), math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(first, last + 1)]


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v / 1000:.3g}k"
    return f"{v:.3g}"


def _frame(title: str, body: list[str], legend: list[tuple[str, str, bool]], height: float = H) -> str:
    items = []
    for i, (name, color, dashed) in enumerate(legend):
        y = TOP + 14 + 18 * i
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        items.append(f'<line x1="{W - RIGHT + 12}" y1="{y}" x2="{W - RIGHT + 36}" y2="{y}" stroke="{color}" '
                     f'stroke-width="2.5"{dash}/><text x="{W - RIGHT + 42}" y="{y + 4}" class="lg">{escape(name)}</text>')
    return (f'<svg class="chart" viewBox="0 0 {W} {height:.0f}" role="img" xmlns="http://www.w3.org/2000/svg">'
            f'<title>{escape(title)}</title><text x="{LEFT}" y="20" class="ct">{escape(title)}</text>'
            + "".join(body) + "".join(items) + "</svg>")


def line_chart(title: str, x_label: str, y_label: str, series: list[Series], log2_x: bool = True) -> str:
    """One line per series over x (log2-spaced when ``log2_x``: concurrency 1, 4, 16, 64 fall evenly)."""
    pts = [p for s in series for p in s.points if p[1] is not None and math.isfinite(p[1])]
    if not pts:
        return _frame(title, [f'<text x="{W / 2}" y="{H / 2}" class="empty">no data</text>'], [])
    fx = (lambda x: math.log2(x)) if log2_x else (lambda x: x)
    xs = sorted({p[0] for p in pts})
    x0, x1 = fx(xs[0]), fx(xs[-1])
    x1 = x1 if x1 > x0 else x0 + 1
    yt = _nice_ticks(0.0, max(p[1] for p in pts) * 1.05)
    y1 = yt[-1]
    px = lambda x: LEFT + (fx(x) - x0) / (x1 - x0) * (W - LEFT - RIGHT)  # noqa: E731
    py = lambda y: H - BOTTOM - y / y1 * (H - TOP - BOTTOM)  # noqa: E731
    body = [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" class="ax"/>',
            f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" class="ax"/>']
    for t in yt:
        body.append(f'<line x1="{LEFT}" y1="{py(t):.1f}" x2="{W - RIGHT}" y2="{py(t):.1f}" class="grid"/>'
                    f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" class="tk" text-anchor="end">{_fmt(t)}</text>')
    for x in xs:
        body.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 16}" class="tk" text-anchor="middle">{_fmt(x)}</text>')
    body.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 10}" class="al" text-anchor="middle">{escape(x_label)}</text>')
    body.append(f'<text x="14" y="{(TOP + H - BOTTOM) / 2}" class="al" text-anchor="middle" '
                f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{escape(y_label)}</text>')
    legend = []
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        good = sorted((x, y) for x, y in s.points if y is not None and math.isfinite(y))
        if not good:
            continue
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in good)
        body.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2.5"{dash} class="series"/>')
        body += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}"><title>{escape(s.name)}: '
                 f'{_fmt(x)} → {y:.4g}</title></circle>' for x, y in good]
        legend.append((s.name, color, s.dashed))
    return _frame(title, body, legend)


def bar_chart(title: str, y_label: str, categories: list[str], groups: dict[str, list[float | None]],
              y_max: float | None = None) -> str:
    """Grouped bars: one group per category, one bar per key of ``groups`` (e.g. one per draft)."""
    values = [v for vs in groups.values() for v in vs if v is not None]
    if not categories or not values:
        return _frame(title, [f'<text x="{W / 2}" y="{H / 2}" class="empty">no data</text>'], [])
    yt = _nice_ticks(0.0, y_max if y_max is not None else max(values) * 1.05)
    top = yt[-1]
    inner = W - LEFT - RIGHT
    slot = inner / len(categories)
    bw = slot * 0.8 / max(1, len(groups))
    py = lambda y: H - BOTTOM - y / top * (H - TOP - BOTTOM)  # noqa: E731
    body = [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" class="ax"/>']
    for t in yt:
        body.append(f'<line x1="{LEFT}" y1="{py(t):.1f}" x2="{W - RIGHT}" y2="{py(t):.1f}" class="grid"/>'
                    f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" class="tk" text-anchor="end">{_fmt(t)}</text>')
    for ci, cat in enumerate(categories):
        cx = LEFT + slot * (ci + 0.5)
        body.append(f'<text x="{cx:.1f}" y="{H - BOTTOM + 14}" class="tk" text-anchor="end" '
                    f'transform="rotate(-30 {cx:.1f} {H - BOTTOM + 14})">{escape(cat)}</text>')
    legend = []
    for gi, (name, vs) in enumerate(groups.items()):
        color = PALETTE[gi % len(PALETTE)]
        legend.append((name, color, False))
        for ci, v in enumerate(vs):
            if v is None:
                continue
            x = LEFT + slot * ci + slot * 0.1 + bw * gi
            body.append(f'<rect x="{x:.1f}" y="{py(v):.1f}" width="{bw:.1f}" height="{H - BOTTOM - py(v):.1f}" '
                        f'fill="{color}" class="bar"><title>{escape(name)} · {escape(categories[ci])}: {v:.4g}'
                        f'</title></rect>')
    return _frame(title, body, legend)


def heatmap(title: str, rows: list[str], cols: list[str], cells: dict[tuple[int, int], tuple[float, str, bool]],
            row_label: str, col_label: str) -> str:
    """cells[(row, col)] = (value, label, marked): colour diverges around 1.0 (red below, green above); a marked
    cell (a regression) gets a thick border."""
    if not rows or not cols:
        return _frame(title, [f'<text x="{W / 2}" y="{H / 2}" class="empty">no data</text>'], [])
    cw = (W - LEFT - 24) / len(cols)
    ch = min(56.0, (H - TOP - BOTTOM) / len(rows))
    height = TOP + ch * len(rows) + 48
    body = []
    for j, c in enumerate(cols):
        body.append(f'<text x="{LEFT + cw * (j + 0.5):.1f}" y="{TOP + ch * len(rows) + 18:.1f}" class="tk" '
                    f'text-anchor="middle">{escape(c)}</text>')
    body.append(f'<text x="{LEFT + cw * len(cols) / 2:.1f}" y="{TOP + ch * len(rows) + 36:.1f}" class="al" '
                f'text-anchor="middle">{escape(col_label)}</text>')
    body.append(f'<text x="14" y="{TOP + ch * len(rows) / 2:.1f}" class="al" text-anchor="middle" '
                f'transform="rotate(-90 14 {TOP + ch * len(rows) / 2:.1f})">{escape(row_label)}</text>')
    for i, r in enumerate(rows):
        body.append(f'<text x="{LEFT - 6}" y="{TOP + ch * (i + 0.5) + 4:.1f}" class="tk" text-anchor="end">'
                    f'{escape(r)}</text>')
        for j in range(len(cols)):
            cell = cells.get((i, j))
            x, y = LEFT + cw * j, TOP + ch * i
            if cell is None:
                body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cw:.1f}" height="{ch:.1f}" class="hm-empty"/>')
                continue
            value, label, marked = cell
            stroke = ' stroke="#000" stroke-width="3"' if marked else ' stroke="#fff" stroke-width="1"'
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cw:.1f}" height="{ch:.1f}" fill="{_diverging(value)}"'
                        f'{stroke} class="cell"><title>{escape(rows[i])}, {escape(cols[j])}: {escape(label)}</title></rect>'
                        f'<text x="{x + cw / 2:.1f}" y="{y + ch / 2 + 4:.1f}" class="cv" text-anchor="middle">'
                        f'{escape(label)}</text>')
    return _frame(title, body, [], height)


def _diverging(v: float) -> str:
    """1.0 is white; 0.5 and below full red, 2.0 and above full green (log scale)."""
    t = max(-1.0, min(1.0, math.log2(max(v, 1e-9))))
    if t >= 0:
        r, g, b = int(255 - 155 * t), int(255 - 55 * t), int(255 - 155 * t)
    else:
        r, g, b = 255, int(255 + 155 * t), int(255 + 155 * t)
    return f"#{r:02x}{g:02x}{b:02x}"
