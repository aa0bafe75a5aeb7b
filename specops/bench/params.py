"""Parsing of the sweep's text options (grid lists, SLOs, arrival rate) into checked values, with one-line errors."""

from __future__ import annotations

import math
import re

from specops.bench.latency import SLO_METRICS
from specops.bench.store import NAMED_GAMMAS
from specops.errors import SpecopsError

_SLO_ALIASES = {"e2el": "e2e"}


def _number(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecopsError(f"{option}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise SpecopsError(f"{option}: {text!r} is not a finite number")
    return value


def int_list(option: str, text: str, minimum: int) -> list[int]:
    """``"0,1,3"`` → [0, 1, 3] (sorted, duplicates dropped); every value an integer ≥ ``minimum``."""
    values = []
    for part in _parts(option, text):
        v = _number(option, part)
        if not v.is_integer():
            raise SpecopsError(f"{option}: {part!r} is not a whole number")
        if v < minimum:
            raise SpecopsError(f"{option}: {part!r} is below the minimum {minimum}")
        values.append(int(v))
    return sorted(set(values))


def gamma_list(text: str) -> list[int | str]:
    """``--gamma``: ``"0,1,3,auto,schedule"`` → [0, 1, 3, "auto", "schedule"] (``auto``: the engine chooses γ every
    step; ``schedule``: γ by batch size from --gamma-schedule)."""
    parts = _parts("--gamma", text)
    named = {p.lower() for p in parts} & set(NAMED_GAMMAS)
    fixed = ",".join(p for p in parts if p.lower() not in NAMED_GAMMAS)
    return (int_list("--gamma", fixed, 0) if fixed else []) + [g for g in NAMED_GAMMAS if g in named]


def float_list(option: str, text: str, minimum: float) -> list[float]:
    values = []
    for part in _parts(option, text):
        v = _number(option, part)
        if v < minimum:
            raise SpecopsError(f"{option}: {part!r} is below the minimum {minimum:g}")
        values.append(v)
    return sorted(set(values))


def _parts(option: str, text: str) -> list[str]:
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise SpecopsError(f"{option}: expected comma-separated numbers, got {text!r}")
    return parts


def duration_s(option: str, text: str) -> float:
    """``"2000ms"``, ``"2s"`` or a bare number of milliseconds → seconds (> 0)."""
    m = re.fullmatch(r"\s*([^a-z\s]+)\s*(ms|s)?\s*", text.lower())
    if not m:
        raise SpecopsError(f"{option}: {text!r} is not a duration like 2000ms or 2s")
    value = _number(option, m.group(1))
    if value <= 0:
        raise SpecopsError(f"{option}: {text!r} must be positive")
    return value if m.group(2) == "s" else value / 1000.0


def slo(text: str) -> dict[str, float]:
    """``"e2e=2000ms,ttft=500ms"`` → {"e2e": 2.0, "ttft": 0.5} (seconds); keys ttft, tpot, e2e (alias e2el)."""
    out: dict[str, float] = {}
    for part in _parts("--slo", text):
        key, sep, value = part.partition("=")
        key = _SLO_ALIASES.get(key.strip().lower(), key.strip().lower())
        if not sep or key not in SLO_METRICS:
            raise SpecopsError(f"--slo: {part!r} is not KEY=DURATION with KEY one of {', '.join(SLO_METRICS)}")
        out[key] = duration_s(f"--slo {key}", value)
    return out


def rate(text: str | None) -> float | None:
    """``"poisson:4"`` → 4.0 requests/s (open-loop arrivals); None or ``"closed"`` → closed loop."""
    if text is None or text.strip().lower() in ("", "closed"):
        return None
    kind, sep, value = text.partition(":")
    if kind.strip().lower() != "poisson" or not sep:
        raise SpecopsError(f"--rate: {text!r} is not poisson:R (R requests per second)")
    r = _number("--rate", value.strip())
    if r <= 0:
        raise SpecopsError(f"--rate: the rate must be positive, got {value.strip()!r}")
    return r
