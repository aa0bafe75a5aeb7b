"""Schema-aware drafting: the tokens a JSON schema forces, proposed without the draft model, and verified exactly.

Forced tokens are checked on schemas with enums, nested objects, arrays, optional keys and unicode strings; the
engine with each drafter must equal constrained decoding without speculation (greedy: token for token; sampling:
the same distribution, by a two-sample test whose power is computed, not assumed).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from engine_helpers import bigram_draft, make_target
from scipy import stats
from serve_helpers import train_tokenizer
from transformers import AutoTokenizer

from specops.engine.engine import Engine
from specops.engine.grammar import Grammars
from specops.engine.proposer import DraftInput, SchemaProposer
from specops.engine.sampling import SamplingParams
from specops.engine.verify import verify
from specops.errors import SpecopsError
from specops.inputs import parse_input, prompt_ids
from specops.task import synth
from specops.task.schema import SCHEMA

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny"


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


# (schema, canonical instances: json.dumps's separators, as a model trained on canonical JSON writes them)
CASES = {
    "enums": (obj({"colour": {"enum": ["blue", "black", "red"]}, "size": {"enum": ["S", "M", "XL"]}}),
              [{"colour": "black", "size": "XL"}, {"colour": "red", "size": "S"}]),
    "nested": (obj({"item": obj({"name": {"type": "string"}, "price": {"type": "integer"}}),
                    "ok": {"type": "boolean"}}),
               [{"item": {"name": "lamp", "price": 120}, "ok": True}]),
    "arrays": (obj({"tags": {"type": "array", "items": {"enum": ["new", "sale"]}},
                    "sizes": {"type": "array", "items": {"type": "string"}}}),
               [{"tags": ["sale", "new"], "sizes": []}, {"tags": [], "sizes": ["9", "10"]}]),
    "optional": (obj({"a": {"type": "integer"}, "b": {"type": "string"}}, required=["b"]),
                 [{"b": "x"}, {"a": 3, "b": "y"}]),
    "unicode": (obj({"keywords": {"type": "array", "items": {"type": "string"}},
                     "category": {"enum": ["羽絨外套", "涼鞋"]}}),
                [{"keywords": ["超級好用", "café"], "category": "涼鞋"}]),
    "commerce": (SCHEMA, [synth.generate(1, seed=5)[0].gold]),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars(tokenizer, 1030)


def fresh(grammars, tokenizer, schema):
    return grammars.constraint(fmt(schema), [tokenizer.eos_token_id])


def forced_text(tokenizer, c, pending=()) -> tuple[list[int], bool]:
    """The forced tokens after the committed ones plus ``pending``, and whether the real grammar accepts them."""
    with c.drafting(list(pending)) as cur:
        ids = cur.forced()
        ok = all(cur.advance(t) for t in ids)
    return ids, ok


@pytest.mark.parametrize("case", sorted(CASES))
def test_forced_tokens_continue_every_canonical_answer(grammars, tokenizer, case):
    """At every token boundary of a canonical answer, the forced tokens are allowed by the grammar and spell what
    the answer says next; and over an answer they cover much of its structure."""
    schema, instances = CASES[case]
    for inst in instances:
        text = json.dumps(inst, ensure_ascii=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        c = fresh(grammars, tokenizer, schema)
        covered = 0
        for i in range(len(ids) + 1):
            forced, ok = forced_text(tokenizer, c)
            assert ok, f"{case}: a forced token the grammar rejects after {tokenizer.decode(ids[:i])!r}"
            spelled = tokenizer.decode(ids[:i] + forced)
            if "\ufffd" not in spelled:  # a boundary inside a multi-byte character decodes with replacements
                assert text.startswith(spelled) or (i == len(ids) and forced == [tokenizer.eos_token_id]), (
                    f"{case}: forced {tokenizer.decode(forced)!r} after {tokenizer.decode(ids[:i])!r}")
            covered += bool(forced)
            if i < len(ids):
                c.commit([ids[i]])
        assert covered >= 2, f"{case}: the schema forced almost nothing"


def test_forced_tokens_stop_at_a_choice_and_run_to_the_end_when_the_end_is_forced(grammars, tokenizer):
    schema = CASES["enums"][0]
    c = fresh(grammars, tokenizer, schema)
    start, _ = forced_text(tokenizer, c)
    assert '{"colour": "'.startswith(tokenizer.decode(start)) and start
    c.commit(tokenizer.encode('{"colour": "bl', add_special_tokens=False))
    assert forced_text(tokenizer, c)[0] == []  # blue or black: nothing is forced
    c.commit(tokenizer.encode('ack", "size": "X', add_special_tokens=False))
    # The rest of the answer is forced to its end: every token is proposed, the last one included.
    assert tokenizer.decode(forced_text(tokenizer, c)[0]) == 'L"}'
    optional = fresh(grammars, tokenizer, CASES["optional"][0])
    assert '"a"' not in tokenizer.decode(forced_text(tokenizer, optional)[0])  # a is optional: not forced


def test_forced_tokens_end_once_the_output_leaves_canonical_json(grammars, tokenizer):
    c = fresh(grammars, tokenizer, CASES["enums"][0])
    c.commit(tokenizer.encode("{ ", add_special_tokens=False))  # allowed (free whitespace), not canonical
    assert forced_text(tokenizer, c)[0] == []
    c2 = fresh(grammars, tokenizer, CASES["enums"][0])
    with c2.drafting(tokenizer.encode("{ ", add_special_tokens=False)) as cur:  # on a cursor: until rolled back
        assert cur.forced() == []
    assert forced_text(tokenizer, c2)[0]


def test_cursor_rollback_restores_the_forced_tokens_and_the_mask(grammars, tokenizer):
    schema = CASES["commerce"][0]
    c = fresh(grammars, tokenizer, schema)
    c.commit(tokenizer.encode('{"intent": "search", "keywords": ["lamp"]', add_special_tokens=False))
    before, mask = forced_text(tokenizer, c)[0], c.mask()
    with c.drafting(before) as cur:
        while run := cur.forced():
            for t in run:
                cur.advance(t)
    assert forced_text(tokenizer, c)[0] == before and torch.equal(c.mask(), mask)


def test_json_object_forces_nothing(grammars, tokenizer):
    c = grammars.constraint({"type": "json_object"}, [tokenizer.eos_token_id])
    assert forced_text(tokenizer, c)[0] == []


# -- verification with rows of different lengths -------------------------------------------------------------------


def test_verify_stops_each_row_at_its_own_length():
    v = 7
    logits = torch.full((2, 4, v), -5.0)
    target = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    logits.scatter_(2, target.unsqueeze(-1), 5.0)
    drafts = torch.tensor([[1, 2, 3], [1, 2, 0]])  # row 1 drafted 2 tokens; its third slot is padding
    lengths = torch.tensor([3, 2])
    n, out = verify(logits, None, drafts, None, torch.tensor([True, True]), None, None, lengths)
    assert n.tolist() == [3, 2] and out[0].tolist() == [1, 2, 3, 4] and out[1, :3].tolist() == [1, 2, 3]
    drafts[1, 2] = 3  # a padding slot equal to the target's choice is still never accepted
    n, _ = verify(logits, None, drafts, None, torch.tensor([True, True]), None, None, lengths)
    assert n.tolist() == [3, 2]
    # Sampling rows: padding has q = 0 after a row's last draft, so the token there comes from p.
    probs = torch.softmax(logits, -1)
    q = torch.nn.functional.one_hot(drafts, v).float()
    u = torch.zeros(2, 3)
    n, out = verify(logits, probs, drafts, q, torch.tensor([False, False]), u, torch.tensor([0.5, 0.5]), lengths)
    assert n.tolist() == [3, 2] and out[1, 2].item() == 3


def test_schema_proposer_drafts_forced_runs_up_to_its_cap(grammars, tokenizer):
    c = fresh(grammars, tokenizer, CASES["commerce"][0])
    empty = torch.zeros(2, 1, dtype=torch.long)
    inp = DraftInput(empty, None, None, None, torch.zeros(2, dtype=torch.long), None, None, None, None, None, 0,
                     guides=[c.drafting([]), None])
    drafts, probs, lengths = SchemaProposer(4, 1030).propose(inp, None)
    assert probs is None and lengths.tolist() == [4, 0] and drafts.shape == (2, 4)
    assert '{"intent": "'.startswith(tokenizer.decode(drafts[0].tolist()))


# -- the engine: lossless against constrained decoding without speculation --------------------------------------


@pytest.fixture(scope="module")
def commerce():
    engines = {"plain": Engine.load(FIXTURE / "target-merged", max_batch=3)}
    engines["eagle3"] = Engine.load(FIXTURE / "target-merged", FIXTURE / "draft-domain", gamma=3, max_batch=3)
    engines["schema"] = Engine.load(FIXTURE / "target-merged", drafter="schema", max_batch=3)
    engines["schema+eagle3"] = Engine.load(FIXTURE / "target-merged", FIXTURE / "draft-domain", gamma=3,
                                           max_batch=3, drafter="schema+eagle3")
    tok = engines["plain"].tokenizer
    prompts = [prompt_ids(tok, parse_input({"query": x.query})) for x in synth.generate(5, seed=41)]
    return engines, prompts


def test_every_drafter_equals_constrained_greedy_decoding(commerce):
    engines, prompts = commerce
    params = SamplingParams(temperature=0.0, max_tokens=160)
    outs = {k: e.generate(prompts, params, response_format=fmt(SCHEMA), provenance=True) for k, e in engines.items()}
    expected = [o.token_ids for o in outs["plain"]]
    for k in ("eagle3", "schema", "schema+eagle3"):
        assert [o.token_ids for o in outs[k]] == expected, k
    for o in outs["plain"]:
        json.loads(o.text)
    # Forced tokens count as drafted tokens: the schema drafter has no draft model, yet drafts and is accepted.
    s = engines["schema"].stats
    assert s.num_drafts > 0 and s.num_accepted_tokens > 0.8 * s.num_draft_tokens
    both, eagle = engines["schema+eagle3"].stats, engines["eagle3"].stats
    assert both.num_draft_tokens > 3 * both.num_drafts  # rounds longer than γ
    assert eagle.num_draft_tokens == 3 * eagle.num_drafts
    per_forward = lambda os: sum(len(o.token_ids) - 1 for o in os) / sum(len(o.provenance) for o in os)  # noqa: E731
    assert per_forward(outs["schema+eagle3"]) > per_forward(outs["eagle3"])
    for o in outs["schema+eagle3"]:  # the per-request counters add up to the engine's
        assert sum(len(r["drafts"]) for r in o.provenance) >= o.spec.num_draft_tokens
    assert sum(o.spec.num_draft_tokens for o in outs["schema+eagle3"]) == both.num_draft_tokens


def test_without_a_schema_the_schema_drafters_decode_as_before(commerce):
    engines, prompts = commerce
    params = SamplingParams(temperature=0.0, max_tokens=24)
    before = engines["schema"].stats.num_drafts
    expected = [o.token_ids for o in engines["plain"].generate(prompts[:2], params)]
    assert [o.token_ids for o in engines["schema"].generate(prompts[:2], params)] == expected
    assert [o.token_ids for o in engines["schema+eagle3"].generate(prompts[:2], params)] == expected
    assert engines["schema"].stats.num_drafts == before  # nothing forced, nothing drafted


def test_drafter_settings_are_checked():
    with pytest.raises(SpecopsError, match="--drafter must be one of"):
        Engine.load(FIXTURE / "target-merged", drafter="medusa")
    with pytest.raises(SpecopsError, match="drop --draft"):
        Engine.load(FIXTURE / "target-merged", FIXTURE / "draft-domain", drafter="schema")


# -- sampling: the output distribution is unchanged ---------------------------------------------------------------

SMALL = obj({"a": {"enum": ["yes", "no", "maybe"]}, "b": {"type": "boolean"}})
SAMPLES = 600


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("target")
    target = make_target(out, seed=5, kv_heads=2, lm_head_std=0.3)  # spreads its answers over every outcome
    plain = Engine.load(out, max_batch=16, max_seq_len=128)
    return out, target, plain, outcomes(plain, 0)


def outcomes(engine, seed0: int) -> Counter:
    """What each of SAMPLES sampled answers says ((a, b), or where it was cut off), seeds seed0, seed0 + 1, ..."""
    prompts = [[1, 5 + i % 7, 9] for i in range(SAMPLES)]
    params = [SamplingParams(temperature=1.0, max_tokens=40, seed=seed0 + i) for i in range(SAMPLES)]
    found = Counter()
    for o in engine.generate(prompts, params, response_format=fmt(SMALL)):
        if o.finish_reason == "stop":
            d = json.loads(o.text)
            found[(d["a"], d["b"])] += 1
        else:
            found["cut"] += 1
    return found


def two_sample(a: Counter, b: Counter, shift: float = 0.12, alpha: float = 0.001) -> tuple[float, float]:
    """Chi-square homogeneity test of two outcome counts: its p-value, and its power against moving ``shift`` of the
    probability mass from the most to the least likely outcome (non-central chi-square at the pooled rates)."""
    keys = sorted(set(a) | set(b), key=str)
    table = [[a[k] for k in keys], [b[k] for k in keys]]
    p_value = stats.chi2_contingency(table)[1]
    pooled = [(a[k] + b[k]) / (sum(a.values()) + sum(b.values())) for k in keys]
    moved = list(pooled)
    hi, lo = pooled.index(max(pooled)), pooled.index(min(pooled))
    moved[hi] -= shift
    moved[lo] += shift
    n = sum(a.values())  # per arm; the two arms are the same size
    noncentrality = n / 2 * sum((m - p) ** 2 / p for m, p in zip(moved, pooled) if p > 0)
    df = len(keys) - 1
    power = 1 - stats.ncx2.cdf(stats.chi2.ppf(1 - alpha, df), df, noncentrality)
    return p_value, power


@pytest.mark.parametrize("drafter", ["schema", "schema+eagle3"])
def test_sampled_outputs_keep_their_distribution(tiny, drafter):
    out, target, plain, expected = tiny
    draft = bigram_draft(target, plain.model) if drafter == "schema+eagle3" else None
    spec = Engine.load(out, draft, gamma=2, max_batch=16, max_seq_len=128, drafter=drafter)
    got = outcomes(spec, 10_000)  # other seeds: independent samples
    p_value, power = two_sample(expected, got)
    assert power >= 0.9, f"the test is too weak to mean anything (power {power:.2f})"
    assert p_value > 0.001, f"{drafter} changed the output distribution: {dict(expected)} vs {dict(got)}"
    assert spec.stats.num_drafts > 0 and 0 < spec.stats.num_accepted_tokens < spec.stats.num_draft_tokens
