import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specops.task import prompt, schema
from specops.task.synth import empty_params

CONTRACT = Path(__file__).resolve().parents[1].parent / "shared" / "contracts" / "commerce_search.schema.json"
PACKAGED = Path(schema.__file__).with_name("commerce_search.schema.json")


def test_packaged_schema_is_the_contract():
    if not CONTRACT.exists():
        pytest.skip("the shared contract is not next to this checkout")
    assert PACKAGED.read_bytes() == CONTRACT.read_bytes()


def test_fields_follow_contract_order():
    assert schema.FIELDS == ("intent", "keywords", "category", "brands", "price_min", "price_max", "currency",
                             "colors", "sizes", "rating_min", "in_stock", "free_shipping", "condition", "sort")
    assert list(schema.SCHEMA["properties"]) == list(schema.FIELDS)


def test_validate_reports_readable_errors():
    good = empty_params("search")
    assert schema.validate(good) == [] and schema.is_valid(good)
    bad = dict(good, price_max=-1, colors=["teal"], extra=1)
    del bad["sort"]
    errors = schema.validate(bad)
    assert len(errors) == 4
    assert any(e.startswith("price_max:") for e in errors)
    assert any(e.startswith("colors/0:") and "teal" in e for e in errors)
    assert any("'sort' is a required property" in e for e in errors)
    assert any("extra" in e for e in errors)
    assert not schema.is_valid([good])


def test_messages_wrap_the_query():
    msgs = prompt.messages("red Nike hoodie")
    assert msgs == [{"role": "system", "content": prompt.SYSTEM_PROMPT}, {"role": "user", "content": "red Nike hoodie"}]


def test_system_prompt_is_short_and_names_every_key_in_order():
    assert 40 <= len(prompt.SYSTEM_PROMPT.split()) <= 80
    positions = [prompt.SYSTEM_PROMPT.index(f) for f in schema.FIELDS]
    assert positions == sorted(positions)


def test_format_answer_is_canonical():
    params = dict(empty_params("search"), keywords=["慢跑鞋"], price_max=80.0, rating_min=4.5)
    shuffled = dict(reversed(list(params.items())))
    text = prompt.format_answer(shuffled)
    assert text.startswith('{"intent": "search", "keywords": ["慢跑鞋"], "category": null')
    assert '"price_max": 80,' in text and '"rating_min": 4.5,' in text
    assert "\n" not in text


values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=10), st.lists(st.text(max_size=8), max_size=4))


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({f: values for f in schema.FIELDS}))
def test_format_answer_round_trips_and_keeps_order(params):
    text = prompt.format_answer(params)
    back = json.loads(text)
    assert list(back) == list(schema.FIELDS)
    assert back == params  # 80.0 comes back as 80, which compares equal
    assert "\n" not in text
    for f in schema.FIELDS:
        if isinstance(params[f], float) and params[f].is_integer():
            assert isinstance(back[f], int)
