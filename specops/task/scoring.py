"""Task metrics: parse rate, schema validity, per-field exact match and item-level F1.

Any model output is scored, never rejected. Parsing: strip whitespace and ``json.loads`` the text; when
that fails (a trailing end-of-text marker, chatter after the object, a truncated tail), decode the first
JSON object starting at the first ``{`` with ``json.JSONDecoder().raw_decode``. ``parsed`` means a JSON
*object* was found; a list or a bare string is not parsed.

Field comparison normalises values: strings are casefolded and stripped, numbers compare numerically
(80 == 80.0, but a bool is never a number), list fields compare as multisets of normalised items. A key
missing from the prediction is wrong even where the gold value is null or [] (the contract demands every
key); extra keys make the answer invalid but do not change field scores.

F1 counts items: a list field contributes its items, a scalar field its value when not null; null and []
contribute nothing. A field with no gold and no predicted items has F1 = 1.0.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from specops.task.schema import FIELDS, is_valid

_MISSING = object()


def parse(text: str) -> dict | None:
    """The JSON object in ``text``, or None when there is none."""
    text = text.strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        start = text.find("{")
        if start < 0:
            return None
        try:
            obj, _ = json.JSONDecoder().raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            return None
    return obj if isinstance(obj, dict) else None


def _norm(value: Any) -> Any:
    """A hashable, comparison-ready form of one JSON value."""
    if isinstance(value, str):
        return ("s", value.strip().casefold())
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", float(value))
    if isinstance(value, list):
        return ("l", tuple(sorted(Counter(map(_norm, value)).items(), key=repr)))
    return ("j", json.dumps(value, sort_keys=True, ensure_ascii=False))


def _items(value: Any) -> Counter:
    """F1 items of a field value: list items, or the scalar itself when not null."""
    if value is None:
        return Counter()
    if isinstance(value, list):
        return Counter(map(_norm, value))
    return Counter([_norm(value)])


@dataclass
class ExampleScore:
    parsed: bool
    valid: bool
    field_correct: dict[str, bool]
    counts: dict[str, tuple[int, int, int]]  # field -> (tp, fp, fn)
    exact: bool = field(init=False)

    def __post_init__(self):
        self.exact = all(self.field_correct.values())


def score_one(text: str, gold: dict) -> ExampleScore:
    obj = parse(text) if isinstance(text, str) else None
    pred = obj if obj is not None else {}
    correct, counts = {}, {}
    for name in FIELDS:
        p, g = pred.get(name, _MISSING), gold.get(name)
        try:
            pn, pi = (_MISSING, Counter()) if p is _MISSING else (_norm(p), _items(p))
        except RecursionError:  # absurdly nested value: one wrong item
            pn, pi = ("x",), Counter([("x",)])
        correct[name] = pn == _norm(g)
        gi = _items(g)
        tp = sum((pi & gi).values())
        counts[name] = (tp, sum(pi.values()) - tp, sum(gi.values()) - tp)
    return ExampleScore(parsed=obj is not None, valid=obj is not None and is_valid(obj), field_correct=correct,
                        counts=counts)


def _f1(tp: int, fp: int, fn: int) -> float:
    denominator = 2 * tp + fp + fn
    return 1.0 if denominator == 0 else 2 * tp / denominator


@dataclass
class TaskReport:
    n: int
    parse_rate: float
    valid_rate: float
    exact_match: float
    field_accuracy: float
    per_field: dict[str, float]
    per_field_f1: dict[str, float]
    micro_f1: float
    macro_f1: float

    def to_dict(self) -> dict:
        return asdict(self)


def score(texts: Sequence[str], golds: Sequence[dict]) -> TaskReport:
    """Aggregate scores over paired predictions and golds (same length, at least one)."""
    if len(texts) != len(golds):
        raise ValueError(f"{len(texts)} predictions but {len(golds)} golds")
    if not golds:
        raise ValueError("nothing to score")
    scores = [score_one(t, g) for t, g in zip(texts, golds)]
    n = len(scores)
    per_field = {f: sum(s.field_correct[f] for s in scores) / n for f in FIELDS}
    totals = {f: [sum(s.counts[f][k] for s in scores) for k in range(3)] for f in FIELDS}
    per_field_f1 = {f: _f1(*totals[f]) for f in FIELDS}
    micro = _f1(*(sum(totals[f][k] for f in FIELDS) for k in range(3)))
    return TaskReport(
        n=n,
        parse_rate=sum(s.parsed for s in scores) / n,
        valid_rate=sum(s.valid for s in scores) / n,
        exact_match=sum(s.exact for s in scores) / n,
        field_accuracy=sum(per_field.values()) / len(FIELDS),
        per_field=per_field,
        per_field_f1=per_field_f1,
        micro_f1=micro,
        macro_f1=sum(per_field_f1.values()) / len(FIELDS),
    )
