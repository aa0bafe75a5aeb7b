"""Constrained output is strict JSON: no raw control character inside a string, whatever bounds the string has.

xgrammar 0.2.9 lowers a string with ``minLength`` / ``maxLength`` (the commerce schema's keywords, brands and sizes)
to a character class that admits U+0000–U+001F except CR/LF and no escapes at all; Python's ``json.loads`` rejects
such output. The repair must also count length as jsonschema does (code points) and leave every other literal of
the schema as it was. The masks are checked directly on the fixture's byte-level tokenizer (it has a token for
every byte), then the real engine is sampled hot on generated schemas: every finished answer must parse and validate.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
import xgrammar as xg
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from specops.engine.engine import Engine
from specops.engine.grammar import Grammars
from specops.engine.sampling import SamplingParams
from specops.inputs import query_prompt_ids
from specops.task.schema import SCHEMA

# A model this small runs ~20x faster on one thread than on two that other processes share.
torch.set_num_threads(1)

TARGET = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny" / "target-merged"
CONTROL = [chr(c) for c in range(0x20)]


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def obj(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


# name: (response_format, text before a string value, text after it, the length of that string in a whole answer)
STRINGS = {
    "plain": (fmt(obj({"s": {"type": "string"}})), '{"s": "', '"}', 2),
    "bounded": (fmt(obj({"s": {"type": "string", "minLength": 1, "maxLength": 40}})), '{"s": "', '"}', 2),
    "min-only": (fmt(obj({"s": {"type": "string", "minLength": 2}})), '{"s": "', '"}', 2),
    "short": (fmt(obj({"s": {"type": "string", "maxLength": 1}})), '{"s": "', '"}', 1),  # xgrammar inlines these
    "one": (fmt(obj({"s": {"type": "string", "minLength": 1, "maxLength": 1}})), '{"s": "', '"}', 1),
    "bounded-items": (fmt(obj({"s": {"type": "array", "items": {"type": "string", "maxLength": 12}}})),
                      '{"s": ["', '"]}', 2),
    "bounded-names": (fmt({"type": "object", "propertyNames": {"maxLength": 5}}), '{"', '": 1}', 2),
    "json_object": ({"type": "json_object"}, '{"s": "', '"}', 2),
}


@pytest.fixture(scope="module")
def engine():
    return Engine.load(TARGET, max_batch=4, max_seq_len=512)


@pytest.fixture(scope="module")
def grammars(engine):
    return Grammars(engine.tokenizer, engine.vocab_size)


def encode(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def accepts(grammars, engine, response_format: dict, text: str) -> bool:
    """Whether ``text`` is a complete answer under the constraint."""
    c = grammars.constraint(response_format, engine.eos_token_ids)
    try:
        c.commit(encode(engine, text))
    except RuntimeError:
        return False
    return c.completed


@pytest.mark.parametrize("case", list(STRINGS))
def test_inside_a_string_raw_control_characters_are_masked_and_escapes_allowed(engine, grammars, case):
    response_format, opening, _, _ = STRINGS[case]
    tok = engine.tokenizer
    control = [i for i in range(len(tok)) if any(ch in tok.decode([i]) for ch in CONTROL)]
    assert len(control) >= 32  # one byte token per control character, at least

    c = grammars.constraint(response_format, engine.eos_token_ids)
    c.commit(encode(engine, opening))
    mask = c.mask()
    assert not [tok.decode([i]) for i in control if mask[i]]
    for escape in ("\\n", "\\t", '\\"', "\\\\", "\\u0000", "\\u001f"):
        with c.speculate() as cur:
            assert all(cur.mask()[t] and cur.advance(t) for t in encode(engine, escape)), escape


@pytest.mark.parametrize("case", list(STRINGS))
def test_whole_answers_with_escapes_are_accepted_and_raw_control_characters_are_not(engine, grammars, case):
    response_format, opening, closing, length = STRINGS[case]
    pad = "b" * (length - 1)
    assert accepts(grammars, engine, response_format, opening + "\\n" + pad + closing)
    for raw in ("\n", "\t", "\x01", "\x1f"):
        assert not accepts(grammars, engine, response_format, opening + raw + pad + closing), repr(raw)


@pytest.mark.parametrize(("value", "ok"), [
    ("ab", True), ("\\n\\t", True), ("\\u00e9\\\\", True), ("\\ud83d\\ude00x", True),
    ("a", False), ("abcd", False), ("\\n\\t\\r\\f", False),
    ("\\ud83d\\ude00", False),  # one code point, as jsonschema counts it: too short for minLength 2
    ("\\ud83dx", False),  # a lone surrogate is no character
])
def test_length_bounds_count_decoded_characters(engine, grammars, value, ok):
    schema = obj({"s": {"type": "string", "minLength": 2, "maxLength": 3}})
    assert accepts(grammars, engine, fmt(schema), '{"s": "' + value + '"}') == ok
    if ok:
        jsonschema.validate(json.loads('{"s": "' + value + '"}'), schema)


def test_a_utf8_encoded_surrogate_is_no_character_of_a_bounded_string(engine, grammars):
    """ED A0 80 spells U+D800 in the UTF-8 pattern but is not UTF-8: decoded it is three U+FFFD, past maxLength 1."""
    vocab = xg.TokenizerInfo.from_huggingface(engine.tokenizer, vocab_size=engine.vocab_size).decoded_vocab
    response_format = fmt(obj({"s": {"type": "string", "maxLength": 1}}))
    for data, ok in ((b"\xed\x9f\xbf", True), (b"\xed\xa0\x80", False)):  # U+D7FF, then the first surrogate
        c = grammars.constraint(response_format, engine.eos_token_ids)
        c.commit(encode(engine, '{"s": "'))
        with c.speculate() as cur:
            assert all(cur.mask()[t] and cur.advance(t) for t in [vocab.index(bytes([b])) for b in data]) == ok


def test_the_repair_keeps_every_other_literal_of_the_schema(engine, grammars):
    """The repair reparses xgrammar's printed grammar, where U+00E9 then "a" is written "\\xe9a"."""
    values = ["-é -éa", "ÿf", "\xa0b", "中a", "😀a", "\\xe9a"]
    response_format = fmt(obj({"s": {"type": "string", "maxLength": 3}, "e": {"enum": values}}))
    for value in values:
        assert accepts(grammars, engine, response_format, json.dumps({"s": "ab", "e": value}, ensure_ascii=False))
    assert not accepts(grammars, engine, response_format, json.dumps({"s": "ab", "e": "-é -ບ"}, ensure_ascii=False))


# -- the engine, sampled hot: finished answers parse strictly and validate ------------------------------------------

QUERIES = ["wireless earbuds under 80 dollars", "紅色 羽絨外套 size M", "gift for a 5 year old, not plastic",
           "compare\tiphone 15 and pixel 8\n"]


def string_schema() -> st.SearchStrategy[dict]:
    low = st.integers(0, 4)
    return st.one_of(
        st.just({"type": "string"}),
        low.map(lambda n: {"type": "string", "minLength": n}),
        st.tuples(low, st.integers(0, 30)).map(lambda t: {"type": "string", "minLength": t[0],
                                                          "maxLength": t[0] + t[1]}),
    )


def property_schema() -> st.SearchStrategy[dict]:
    return st.one_of(
        string_schema(),
        st.just({"type": "integer"}),
        st.just({"type": "number"}),
        st.just({"type": "boolean"}),
        st.lists(st.text("abcxyz -\n\"é", min_size=1, max_size=6), min_size=1, max_size=4,
                 unique=True).map(lambda vs: {"enum": vs}),
        string_schema().map(lambda items: {"type": "array", "items": items}),
    )


@st.composite
def schemas(draw) -> dict:
    names = draw(st.lists(st.sampled_from(["name", "brand", "note", "count", "price", "ok", "tags", "kind"]),
                          min_size=1, max_size=4, unique=True))
    props = {n: draw(property_schema()) for n in names}
    required = [n for n in names if draw(st.booleans())]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def check_answers(engine, response_format: dict, schema: dict | None, seed: int, temperature: float) -> None:
    prompts = [query_prompt_ids(engine.tokenizer, q) for q in QUERIES]
    params = [SamplingParams(temperature=temperature, max_tokens=200, seed=seed * 10 + i) for i in range(len(QUERIES))]
    for out in engine.generate(prompts, params, response_format=response_format):
        if out.finish_reason != "stop":
            continue  # cut by max_tokens: an unfinished answer is allowed to be invalid
        answer = json.loads(out.text)  # strict: raw control characters in strings are errors
        if schema is not None:
            jsonschema.validate(answer, schema)


# No shrinking: each example is a few hundred sampled tokens, and a failing one is already small enough to read.
@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(schema=schemas(), seed=st.integers(0, 2**16), temperature=st.sampled_from([1.0, 2.0, 3.0]))
@example(schema=SCHEMA, seed=1, temperature=2.0)  # the task's schema: its keywords, brands, sizes are bounded
def test_sampled_json_schema_answers_parse_strictly_and_validate(engine, schema, seed, temperature):
    check_answers(engine, fmt(schema), schema, seed, temperature)


@pytest.mark.parametrize("seed", range(3))
def test_sampled_json_object_answers_parse_strictly(engine, seed):
    check_answers(engine, {"type": "json_object"}, None, seed, 1.5)
