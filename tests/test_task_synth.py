import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specops.errors import SpecopsError
from specops.task import lexicon, synth
from specops.task.schema import SCHEMA, validate


@pytest.fixture(scope="module")
def corpus():
    return synth.generate(3000, seed=7)


def test_same_seed_same_examples_and_prefix_stable():
    a = synth.generate(200, seed=5)
    assert a == synth.generate(200, seed=5)
    assert a[:50] == synth.generate(50, seed=5)
    assert a != synth.generate(200, seed=6)
    assert [e.lang for e in synth.generate(50, seed=5, langs=("zh-TW",))] == ["zh-TW"] * 50


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**40))
def test_every_gold_is_schema_valid(seed):
    for e in synth.generate(40, seed=seed):
        assert validate(e.gold) == [], (e.query, e.gold)


def _price_forms(v: float) -> set[str]:
    if v != int(v):
        return {f"{v:.2f}"}
    v = int(v)
    forms = {str(v), f"{v:,}", f"{v / 1000:g}k", f"{v // 1000}千", f"{v // 10000}萬"}
    return forms | ({synth._zh_numeral(v)} if v % 100 == 0 else set())


def test_gold_values_are_derivable_from_the_query(corpus):
    for e in corpus:
        g, q = e.gold, e.query
        for value in g["keywords"] + g["brands"] + g["sizes"]:
            assert value in q, (value, q)
        words = lexicon.COLORS[e.lang]
        for color in g["colors"]:
            assert any(w in q.lower() for w, c in words.items() if c == color), (color, q)
        for price in (g["price_min"], g["price_max"]):
            if price is not None:
                assert any(f in q for f in _price_forms(price)), (price, q)
        if g["currency"] is not None:
            marks = lexicon.CURRENCY_MARKS[e.lang][g["currency"]]
            assert any((pre or suf).strip().lower() in q.lower() for pre, suf in marks), q
        if g["rating_min"] is not None:
            assert f"{g['rating_min']:g}" in q or re.search("three|four|三|四", q), q
        if g["intent"] in ("order_status", "other"):
            assert g["keywords"] == [] and g["category"] is None and g["price_max"] is None
        if g["intent"] in ("order_status", "return_request", "other"):
            assert g["sort"] == "relevance"


def test_coverage_of_every_enum_and_both_languages(corpus):
    props = SCHEMA["properties"]
    for name in ("intent", "category", "currency", "sort", "condition"):
        seen = {e.gold[name] for e in corpus}
        assert seen == set(props[name]["enum"]), name
    assert {c for e in corpus for c in e.gold["colors"]} == set(props["colors"]["items"]["enum"])
    langs = Counter(e.lang for e in corpus)
    assert langs["en"] > 1000 and langs["zh-TW"] > 1000
    for key in ("rating_min", "in_stock", "free_shipping"):
        assert sum(e.gold[key] is not None for e in corpus) > 100, key
    assert sum(bool(e.gold["sizes"]) for e in corpus) > 100 and sum(bool(e.gold["brands"]) for e in corpus) > 500
    assert any(e.gold["price_min"] != int(e.gold["price_min"] or 0) or
               e.gold["price_max"] != int(e.gold["price_max"] or 0) for e in corpus)


PRICE_PHRASINGS = [r"under \$\d", r"\d+ bucks", r"between [^ ]*\d+ and", r"\$\d+-\$?\d+", r"at least [^ ]*\d",
                   r"no more than", r"¥\d", r"[一二兩三四五六七八九十百千萬]+元以下", r"\d+到\d+元", r"\d+元以上",
                   r"NT\$\d", r"\d+ euros", r"[\d,.k]+ yen", r"預算"]


def test_price_phrasings_vary(corpus):
    queries = [e.query for e in synth.generate(6000, seed=8)]
    for pattern in PRICE_PHRASINGS:
        assert any(re.search(pattern, q) for q in queries), pattern


def test_queries_are_short_and_varied(corpus):
    en = [len(e.query.split()) for e in corpus if e.lang == "en"]
    zh = [len(e.query) for e in corpus if e.lang == "zh-TW"]
    assert max(en) <= 30 and sorted(en)[int(0.95 * len(en))] <= 25
    assert sorted(zh)[int(0.95 * len(zh))] <= 40
    assert len({e.query for e in corpus}) > 0.85 * len(corpus)
    lead_words = Counter(e.query.split()[0].lower() for e in corpus if e.lang == "en")
    assert len(lead_words) > 40 and lead_words.most_common(1)[0][1] < 0.15 * len(en)


def test_typos_leave_values_alone():
    import random

    rng = random.Random(0)
    for _ in range(200):
        out = synth._typo(rng, "looking for {p} please")
        assert "{p}" in out and out != "looking for {p} please"


def test_zh_numerals():
    cases = {500: "五百", 1500: "一千五百", 2000: "兩千", 3050: "三千零五十", 10000: "一萬", 12000: "一萬兩千",
             20000: "兩萬", 30500: "三萬零五百", 15: "十五"}
    assert {n: synth._zh_numeral(n) for n in cases} == cases


def test_held_out_never_repeats_a_training_query():
    train = synth.generate(2000, seed=0)
    test = synth.held_out(500, seed=1, exclude=train)
    assert len(test) == 500
    seen = {e.query.casefold() for e in train}
    assert not any(e.query.casefold() in seen for e in test)
    assert len({e.query.casefold() for e in test}) == 500
    assert test == synth.held_out(500, seed=1, exclude=train)


def test_bad_languages_are_refused():
    with pytest.raises(SpecopsError):
        synth.generate(3, langs=("fr",))
    with pytest.raises(SpecopsError):
        synth.generate(3, langs=())


def test_jsonl_round_trip(tmp_path):
    examples = synth.generate(50, seed=3)
    path = tmp_path / "sub" / "data.jsonl"
    synth.write_examples(examples, path)
    assert synth.read_examples(path) == examples
    assert any(e.lang == "zh-TW" for e in examples) and "\\u" not in path.read_text(encoding="utf-8")
    assert examples[0].to_json() == {"id": examples[0].id, "lang": examples[0].lang, "query": examples[0].query,
                                     "gold": examples[0].gold}


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    synth.write_examples(synth.generate(2), path)
    path.write_text(path.read_text(encoding="utf-8") + '{"id": 1}\n', encoding="utf-8")
    with pytest.raises(SpecopsError, match=r"bad\.jsonl:3"):
        synth.read_examples(path)
    with pytest.raises(SpecopsError, match="cannot read"):
        synth.read_examples(tmp_path / "missing.jsonl")
