import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specops.task import prompt, scoring
from specops.task.schema import FIELDS
from specops.task.synth import empty_params, generate

GOLD = dict(empty_params("search"), keywords=["running shoes", "waterproof"], category="shoes", brands=["Nike"],
            price_max=120, currency="USD", colors=["black"], sizes=["10"])


def answer(**changes) -> str:
    return prompt.format_answer(dict(GOLD, **changes))


def test_perfect_answer():
    s = scoring.score_one(answer(), GOLD)
    assert s.parsed and s.valid and s.exact
    assert all(s.field_correct.values())
    assert s.counts["keywords"] == (2, 0, 0) and s.counts["price_max"] == (1, 0, 0) and s.counts["condition"] == (0, 0, 0)


def test_normalisation_case_whitespace_order_and_numbers():
    text = answer(keywords=["Waterproof ", "RUNNING SHOES"], brands=["nike"], price_max=120.0)
    s = scoring.score_one(text, GOLD)
    assert s.exact and s.valid


def test_one_wrong_field():
    s = scoring.score_one(answer(currency="EUR"), GOLD)
    assert s.parsed and s.valid and not s.exact
    assert [f for f, ok in s.field_correct.items() if not ok] == ["currency"]
    assert s.counts["currency"] == (0, 1, 1)


def test_list_partial_overlap_f1():
    # gold keywords: running shoes, waterproof; predicted: running shoes, trail
    report = scoring.score([answer(keywords=["running shoes", "trail"])], [GOLD])
    assert report.per_field["keywords"] == 0.0
    assert report.per_field_f1["keywords"] == pytest.approx(0.5)  # tp 1, fp 1, fn 1
    # gold items over all fields: intent, 2 keywords, category, brand, price_max, currency, colour, size, sort = 10
    assert report.micro_f1 == pytest.approx(2 * 9 / (2 * 9 + 1 + 1))
    assert report.macro_f1 == pytest.approx((13 + 0.5) / 14)
    assert report.field_accuracy == pytest.approx(13 / 14)
    assert report.exact_match == 0.0 and report.valid_rate == 1.0


def test_non_json_scores_zero_without_crashing():
    s = scoring.score_one("I could not find anything", GOLD)
    assert not s.parsed and not s.valid and not s.exact
    assert not any(s.field_correct.values())
    assert s.counts["keywords"] == (0, 0, 2) and s.counts["condition"] == (0, 0, 0)


def test_truncated_json_and_list_are_not_parsed():
    assert not scoring.score_one(answer()[:-20], GOLD).parsed
    assert not scoring.score_one(json.dumps([json.loads(answer())]), GOLD).parsed


def test_trailing_marker_and_whitespace():
    s = scoring.score_one("\n  " + answer() + "<|endoftext|>  ", GOLD)
    assert s.parsed and s.exact
    assert scoring.score_one("Sure: " + answer() + " hope it helps", GOLD).exact


def test_wrong_types_are_wrong_but_scored():
    s = scoring.score_one(answer(price_max="120", brands="Nike", in_stock=1, sizes=[10]), GOLD)
    assert s.parsed and not s.valid
    assert not s.field_correct["price_max"] and not s.field_correct["brands"]
    assert not s.field_correct["in_stock"]  # 1 is not a boolean (gold null)
    assert not s.field_correct["sizes"]  # the number 10 is not the string "10"
    assert s.counts["in_stock"] == (0, 1, 0)


def test_bool_is_not_a_number():
    gold = dict(GOLD, price_min=1)
    assert not scoring.score_one(prompt.format_answer(dict(gold, price_min=True)), gold).field_correct["price_min"]


def test_null_versus_missing():
    obj = json.loads(answer())
    del obj["condition"]  # gold condition is null: a missing key is still wrong
    s = scoring.score_one(json.dumps(obj), GOLD)
    assert s.parsed and not s.valid and not s.field_correct["condition"] and not s.exact
    assert s.counts["condition"] == (0, 0, 0)
    s = scoring.score_one(answer(condition="new"), GOLD)
    assert s.valid and not s.field_correct["condition"] and s.counts["condition"] == (0, 1, 0)


def test_extra_keys_invalidate_but_do_not_change_fields():
    obj = dict(json.loads(answer()), note="x")
    s = scoring.score_one(json.dumps(obj), GOLD)
    assert s.parsed and not s.valid and s.exact


def test_score_aggregates_and_checks_lengths():
    report = scoring.score([answer(), "nope"], [GOLD, GOLD])
    assert report.n == 2 and report.parse_rate == 0.5 and report.exact_match == 0.5
    assert set(report.to_dict()) >= {"n", "parse_rate", "valid_rate", "exact_match", "field_accuracy", "per_field",
                                     "micro_f1", "macro_f1"}
    assert json.loads(json.dumps(report.to_dict()))["per_field"]["intent"] == 0.5
    with pytest.raises(ValueError):
        scoring.score(["x"], [GOLD, GOLD])
    with pytest.raises(ValueError):
        scoring.score([], [])


def test_gold_answers_score_perfectly():
    examples = generate(300, seed=11)
    report = scoring.score([prompt.format_answer(e.gold) for e in examples], [e.gold for e in examples])
    assert report.exact_match == 1.0 and report.valid_rate == 1.0 and report.macro_f1 == 1.0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
texts = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.dictionaries(st.sampled_from(FIELDS + ("extra",)), json_values).map(json.dumps),
    st.tuples(st.dictionaries(st.sampled_from(FIELDS), json_values), st.integers(0, 300))
    .map(lambda t: json.dumps(t[0])[: t[1]]),
)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_score_one_never_crashes(text):
    s = scoring.score_one(text, GOLD)
    assert set(s.field_correct) == set(FIELDS)
    assert s.exact == all(s.field_correct.values())
    assert not s.valid or s.parsed
    for tp, fp, fn in s.counts.values():
        assert min(tp, fp, fn) >= 0
    report = scoring.score([text], [GOLD])
    assert 0.0 <= report.micro_f1 <= 1.0 and 0.0 <= report.macro_f1 <= 1.0
