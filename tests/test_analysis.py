"""Acceptance analysis: the JSON lexer and token alignment on tricky answers, and per-class sums that equal the
engine's counters on real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specops.analysis.acceptance import Tally
from specops.analysis.alignment import spans, token_classes
from specops.analysis.json_lexer import label
from specops.models.target import load_tokenizer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny"


def classes_of(text: str) -> str:
    """One letter per character: p q w k s n l t."""
    code = {"punct": "p", "quote": "q", "whitespace": "w", "key": "k", "string": "s", "number": "n",
            "literal": "l", "text": "t"}
    return "".join(code[c] for c in label(text)[0])


def test_lexer_labels_every_role_and_field():
    text = 'ok {"a": "x\\"y", "b": [1.5, true], "c": {"d": null}} bye'
    cls, fields = label(text)
    assert classes_of(text) == "ttt" + "pqkqpw" + "qssssqpw" + "qkqpwpnnnpwllllppw" + "qkqpwpqkqpwllllpp" + "tttt"
    assert fields[text.index("x")] == "a" and fields[text.index("1.5")] == "b[]" and fields[text.index("null")] == "c.d"
    assert fields[text.index('"c"') + 1] == "c" and fields[text.index(",")] is None


def test_lexer_stops_at_invalid_json_and_handles_unicode():
    text = '{"品牌": "華碩", "x": 12a}'
    cls, fields = label(text)
    assert cls[text.index("品")] == "key" and fields[text.index("華")] == "品牌" and cls[text.index("華")] == "string"
    assert cls[text.index("12")] == "number" and cls[text.index("a}")] == "text" and cls[-1] == "text"  # from "a" on
    assert set(label("no json here")[0]) == {"text"}
    assert label('{"a": "line\nbreak"}')[0][-1] == "text"  # a raw control character is not JSON


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(FIXTURE / "target-merged", 3072)


def test_alignment_covers_the_text_once_with_multibyte_and_split_numbers(tokenizer):
    answer = json.dumps({"keywords": ["藍牙耳機"], "price_max": 12345, "brands": ['he said "hi"']}, ensure_ascii=False)
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    text, token_spans = spans(tokenizer, ids)
    assert text == answer
    assert token_spans[0][0] == 0 and token_spans[-1][1] == len(answer)
    assert all(a <= b and b == c for (a, b), (c, _) in zip(token_spans, token_spans[1:]))
    labelled = token_classes(tokenizer, ids)
    assert labelled[-1] == ("end", None)
    digits = [i for i, (a, b) in enumerate(token_spans) if answer[a:b].strip().isdigit()]
    assert len(digits) >= 2 and all(labelled[i] == ("number", "price_max") for i in digits)  # one digit per token
    chinese = [labelled[i] for i, (a, b) in enumerate(token_spans) if any("\u4e00" <= ch <= "\u9fff" for ch in answer[a:b])]
    assert chinese and all(c == ("string", "keywords[]") for c in chinese)


def test_tally_attributes_reached_positions_only():
    classes = [("punct", None)] + [("key", "a")] * 3 + [("string", "a")] * 6
    t = Tally(3)
    # round 1: 2 accepted (tokens 1, 2), correction at position 2 (token 3); round 2: all 3 accepted (4..6) + bonus 7;
    # round 3: 0 accepted, correction at position 0 (token 8); round 4 cut by a stop after 1 emitted token.
    t.add(classes, [{"accepted": a, "emitted": e, "drafts": [0] * 3} for a, e in ((2, 3), (3, 4), (0, 1), (1, 1))])
    s = t.summary()
    assert s["num_accepted_tokens"] == 6 and s["rounds"] == 4 and s["accepted_per_pos"] == [3, 2, 1]
    assert s["class_counts"]["key"] == {"accepted": 2, "rejected": 1}
    assert s["class_counts"]["string"] == {"accepted": 4, "rejected": 1}
    assert s["class_counts"]["after stop"] == {"accepted": 0, "rejected": 1}
    assert s["schema_rejection_share"] == pytest.approx(1 / 3)


def test_tally_follows_rounds_of_any_width():
    """Schema-aware drafting: rounds draft γ tokens or more, and a round that drafted nothing is not one."""
    classes = [("punct", None)] + [("key", "a")] * 5 + [("string", "a")] * 4
    t = Tally(2)
    t.add(classes, [{"accepted": 4, "emitted": 5, "drafts": [0] * 5}, {"accepted": 0, "emitted": 1, "drafts": []},
                    {"accepted": 1, "emitted": 2, "drafts": [0] * 2}])
    s = t.summary()
    assert s["rounds"] == 2 and s["num_draft_tokens"] == 7 and s["accepted_per_pos"] == [2, 1, 1, 1, 0]
    assert s["class_counts"]["key"] == {"accepted": 4, "rejected": 1}  # tokens 1-4 kept, 5 the correction
    assert s["class_counts"]["string"] == {"accepted": 1, "rejected": 1}  # token 7 kept, 8 the correction
    assert len(s["class_by_position"]["key"]) == 5


def test_per_class_counts_sum_to_the_engine_counters(tmp_path):
    """Both fixture drafts on a few held-out queries: accepted per class sums to the engine's total, rounds to its
    drafts, and the heatmap is written."""
    from specops.analysis import heatmap, measure
    from specops.engine.config import EngineConfig
    from specops.engine.sampling import SamplingParams
    from specops.fixtures.recipe import heldout_examples
    from specops.inputs import query_prompt_ids

    tok = load_tokenizer(FIXTURE / "target-merged", 3072)
    prompts = [query_prompt_ids(tok, e.query) for e in heldout_examples(6)]
    result = measure.measure(EngineConfig(FIXTURE / "target-merged", gamma=3),
                             [FIXTURE / "draft-general", FIXTURE / "draft-domain"], prompts,
                             SamplingParams(temperature=0.0, max_tokens=192))
    for d in result["drafts"].values():
        assert d["matches_engine"]
        assert sum(c["accepted"] for c in d["class_counts"].values()) == d["engine_counters"]["num_accepted_tokens"]
        assert sum(c["rejected"] for c in d["class_counts"].values()) == d["rejections"]
    general, domain = result["drafts"]["draft-general"], result["drafts"]["draft-domain"]
    assert general["schema_rejection_share"] > domain["schema_rejection_share"]
    assert result["advice"]
    png = heatmap.write(result["drafts"], tmp_path / "a.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_sweep_records_provenance_that_acceptance_reads(tmp_path):
    """Through the real embedded server, streamed: the recorded provenance rebuilds each answer and its accepted
    counts sum to the server's /metrics counters over the same requests."""
    from specops.analysis import measure
    from specops.bench.config import SweepConfig
    from specops.bench.store import RunStore
    from specops.bench.sweep import run_sweep

    cfg = SweepConfig(out=tmp_path / "run", model=FIXTURE / "target-merged", draft=FIXTURE / "draft-domain",
                      gammas=[3], concurrencies=[2], temperatures=[0.0], synthetic=6, num_prompts=6, max_tokens=160,
                      warmup=1, provenance=True)
    run_sweep(cfg)
    store = RunStore(cfg.out)
    records = store.configs()[0].records
    store.close()
    tok = load_tokenizer(FIXTURE / "target-merged", 3072)
    for r in records:
        assert r.ok and r.provenance["token_ids"] and tok.decode(r.provenance["token_ids"], skip_special_tokens=True) == r.text
    result = measure.from_run(cfg.out, tok)
    (summary,) = result["drafts"].values()
    assert summary["matches_server"] and summary["rounds"] > 0
