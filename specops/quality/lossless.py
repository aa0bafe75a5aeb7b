"""Did the candidate change any answer? Identical outputs, the first difference of each other pair, and for
sampled runs a two-sample test per output field (so "different seeds" can be told from "different distribution")."""

from __future__ import annotations

from specops.quality.outputs import Answer
from specops.quality.stats import categorical_test, numeric_test
from specops.task.schema import FIELDS
from specops.task.scoring import parse

NUMERIC = ("price_min", "price_max", "rating_min")
LISTS = ("keywords", "brands", "colors", "sizes")
SHOWN = 20  # differing pairs listed in full


def _first_difference(a: Answer, b: Answer, by_ids: bool) -> dict:
    x, y, unit = (a.token_ids, b.token_ids, "token") if by_ids else (a.text, b.text, "character")
    i = next((k for k in range(min(len(x), len(y))) if x[k] != y[k]), min(len(x), len(y)))
    at = lambda s: s[i] if i < len(s) else None  # noqa: E731 - None: that side ended here
    return {"unit": unit, "position": i, "baseline": at(x), "candidate": at(y)}


def compare(baseline: dict[str, Answer], candidate: dict[str, Answer]) -> dict:
    ids = sorted(baseline.keys() & candidate.keys())
    by_ids = all(baseline[i].token_ids is not None and candidate[i].token_ids is not None for i in ids)
    same = lambda i: (baseline[i].token_ids == candidate[i].token_ids if by_ids  # noqa: E731
                      else baseline[i].text == candidate[i].text)
    differing = [i for i in ids if not same(i)]
    n_same = len(ids) - len(differing)
    return {"pairs": len(ids), "identical": n_same, "identical_share": n_same / len(ids) if ids else None,
            "compared_by": "token ids" if by_ids else "text",
            "differences": [{"id": i, **_first_difference(baseline[i], candidate[i], by_ids)} for i in differing[:SHOWN]],
            "more_differences": max(0, len(differing) - SHOWN)}


def field_distributions(baseline: dict[str, Answer], candidate: dict[str, Answer]) -> dict:
    """Per field: the test and p-value that the two sides' values come from one distribution."""
    pa = [parse(a.text) or {} for a in baseline.values()]
    pb = [parse(b.text) or {} for b in candidate.values()]
    out = {}
    for f in FIELDS:
        if f in NUMERIC:
            num = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else None  # noqa: E731
            out[f] = numeric_test([num(p.get(f)) for p in pa], [num(p.get(f)) for p in pb])
        elif f in LISTS:
            items = lambda ps: [str(x).casefold() for p in ps for x in (p.get(f) or []) if isinstance(p.get(f), list)]  # noqa: E731
            out[f] = categorical_test(items(pa), items(pb))
        else:
            out[f] = categorical_test([repr(p.get(f)) for p in pa], [repr(p.get(f)) for p in pb])
    return out
