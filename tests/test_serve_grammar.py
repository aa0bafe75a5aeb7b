"""Grammar constraints: masks at draft positions equal masks after committing, outputs validate, rollback is exact."""

from __future__ import annotations

import json
import random

import pytest
import torch
from jsonschema import Draft202012Validator
from serve_helpers import train_tokenizer
from transformers import AutoTokenizer

from specops.engine.grammar import Constraint, GrammarError, Grammars, unpack_bitmask
from specops.engine.sampling import mask_logits_
from specops.task.schema import SCHEMA

VOCAB = 1030  # model vocabulary a little larger than the tokenizer's, as padded lm_heads are
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "commerce_search", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars(tokenizer, VOCAB)


def fresh(grammars, tokenizer, fmt=SCHEMA_FORMAT) -> Constraint:
    return grammars.constraint(fmt, [tokenizer.eos_token_id])


def random_walk(c: Constraint, rng: random.Random, limit: int = 2000) -> list[int]:
    out = []
    while not c.terminated and len(out) < limit:
        allowed = c.mask().nonzero().flatten().tolist()
        t = rng.choice(allowed)
        c.commit([t])
        out.append(t)
    return out


def test_random_walks_under_the_mask_always_give_schema_valid_json(grammars, tokenizer):
    validator = Draft202012Validator(SCHEMA)
    for seed in range(5):
        c = fresh(grammars, tokenizer)
        ids = random_walk(c, random.Random(seed))
        assert c.terminated and ids[-1] == tokenizer.eos_token_id
        obj = json.loads(tokenizer.decode(ids[:-1]))  # strict: no raw control character inside a string
        assert not list(validator.iter_errors(obj)), obj


def test_verification_masks_match_masks_after_committing_the_draft(grammars, tokenizer):
    rng = random.Random(1)
    for trial in range(20):
        c = fresh(grammars, tokenizer)
        prefix = random_walk(fresh(grammars, tokenizer), rng)[: rng.randrange(1, 60)]
        c.commit(prefix)
        before = c.mask()
        # A draft chain that follows the grammar for a while, then proposes a random token.
        walker = fresh(grammars, tokenizer)
        walker.commit(prefix)
        draft = []
        for _ in range(rng.randrange(1, 6)):
            if walker.terminated:
                break
            t = rng.choice(walker.mask().nonzero().flatten().tolist())
            walker.commit([t])
            draft.append(t)
        draft.append(rng.randrange(VOCAB))
        masks = c.verification_masks(draft)
        assert masks.shape == (len(draft) + 1, VOCAB)
        assert torch.equal(c.mask(), before), "speculation must roll back to the committed state"
        ref = fresh(grammars, tokenizer)
        ref.commit(prefix)
        for i, t in enumerate(draft):
            expected = ref.mask() if not ref.terminated else torch.zeros(VOCAB, dtype=torch.bool).index_fill_(
                0, torch.tensor([tokenizer.eos_token_id]), True)
            assert torch.equal(masks[i], expected), (trial, i)
            if not expected[t]:
                assert masks[i + 1 :].all(), "rows after a rejected draft token are unconstrained"
                break
            ref.commit([t])
        else:
            assert torch.equal(masks[-1], ref.mask())


def test_padded_vocabulary_ids_are_never_allowed(grammars, tokenizer):
    c = fresh(grammars, tokenizer, {"type": "json_object"})
    assert not c.mask()[len(tokenizer):].any()


def test_commit_refuses_a_token_outside_the_grammar(grammars, tokenizer):
    c = fresh(grammars, tokenizer)
    bad = tokenizer.encode("hello", add_special_tokens=False)[0]
    with pytest.raises(RuntimeError, match="outside the grammar"):
        c.commit([bad])


def test_compiled_grammars_are_cached_by_schema(grammars):
    assert grammars.compile(SCHEMA_FORMAT) is grammars.compile(json.loads(json.dumps(SCHEMA_FORMAT)))
    other = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}
    assert grammars.compile(other) is not grammars.compile(SCHEMA_FORMAT)


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
    {"type": "json_schema", "json_schema": {"name": "x"}},
    {"type": "regex"},
])
def test_unusable_response_formats_are_client_errors(grammars, fmt):
    with pytest.raises(GrammarError):
        grammars.compile(fmt)


def test_mask_helpers():
    packed = torch.tensor([[0b101, -1]], dtype=torch.int32)
    allowed = unpack_bitmask(packed, 40)
    assert allowed[0, :3].tolist() == [True, False, True] and allowed[0, 32:].all() and not allowed[0, 3:32].any()
    logits = torch.zeros(1, 40)
    mask_logits_(logits, allowed)
    assert torch.isinf(logits[0, 1]) and logits[0, 0] == 0


def test_drafting_cursor_starts_after_pending_tokens_and_rolls_back(grammars, tokenizer):
    walk = random_walk(fresh(grammars, tokenizer), random.Random(3))
    c = fresh(grammars, tokenizer)
    c.commit(walk[:5])
    before = c.mask()
    with c.drafting(walk[5:8]) as cur:
        ref = fresh(grammars, tokenizer)
        ref.commit(walk[:8])
        assert torch.equal(cur.mask(), ref.mask())
        assert cur.advance(walk[8])
    assert torch.equal(c.mask(), before)
