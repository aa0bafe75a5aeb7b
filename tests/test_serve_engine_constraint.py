"""The engine under a grammar constraint: every emitted token is allowed, and speculation stays lossless."""

from __future__ import annotations

import json

import pytest
from engine_helpers import CHARS, bigram_draft, make_target

from specops.engine.engine import Engine
from specops.engine.grammar import Grammars
from specops.engine.sampling import SamplingParams

# Bounded: enums and a boolean, and the tokenizer has no whitespace, so every output must end within ~30 tokens.
SCHEMA = {"type": "object", "properties": {"a": {"enum": ["yes", "no", "maybe"]}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
PROMPTS = [[1, 5, 9, 14], [1, 30, 31], [1, 22, 8, 8, 40, 41], [1, 17]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("target")
    target = make_target(out, seed=3, bigram=0.005, kv_heads=2, chars=CHARS.replace(" ", ""))
    plain = Engine.load(out, max_batch=4, max_seq_len=256)
    spec = Engine.load(out, draft=bigram_draft(target, plain.model), gamma=3, max_batch=4, max_seq_len=256)
    return plain, spec, Grammars(plain.tokenizer, plain.vocab_size)


def run(engine, grammars, params, fmt=FORMAT):
    """Outputs and the constraints they ran under, all requests decoded together."""
    constraints = [grammars.constraint(fmt, engine.eos_token_ids) if fmt else None for _ in PROMPTS]
    for i, (p, c) in enumerate(zip(PROMPTS, constraints)):
        engine.add_request(f"r{i}", p, params, constraint=c)
    outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    reasons = {}
    while engine.has_unfinished():
        for so in engine.step():
            outs[so.request_id] += so.new_token_ids
            if so.finished:
                reasons[so.request_id] = so.finish_reason
    return [(outs[f"r{i}"], reasons[f"r{i}"]) for i in range(len(PROMPTS))], constraints


def allowed(grammars, engine, tokens) -> bool:
    """Whether a fresh matcher accepts ``tokens`` and ends complete."""
    c = grammars.constraint(FORMAT, engine.eos_token_ids)
    try:
        c.commit(tokens)
    except RuntimeError:
        return False
    return c.terminated


def test_constrained_greedy_emits_only_allowed_tokens_and_unconstrained_does_not(models):
    plain, _, grammars = models
    params = SamplingParams(temperature=0.0, max_tokens=60)
    free, _ = run(plain, grammars, params, fmt=None)
    constrained, constraints = run(plain, grammars, params)
    assert not all(allowed(grammars, plain, toks) for toks, _ in free)
    for (toks, reason), c in zip(constrained, constraints):
        assert reason == "stop" and c.terminated and toks[-1] in plain.eos_token_ids
        obj = json.loads(plain.tokenizer.decode(toks[:-1]))
        assert obj["a"] in ("yes", "no", "maybe") and isinstance(obj["b"], bool)


def test_speculation_under_a_constraint_is_lossless_for_greedy(models):
    plain, spec, grammars = models
    params = SamplingParams(temperature=0.0, max_tokens=60)
    before = spec.stats.num_accepted_tokens
    expected, _ = run(plain, grammars, params)
    got, _ = run(spec, grammars, params)
    assert got == expected
    # The draft proposes under the same masks (unmasked, this draft is never accepted on this grammar).
    assert spec.stats.num_accepted_tokens > before


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_speculation_under_a_constraint_emits_only_allowed_tokens(models, seed):
    _, spec, grammars = models
    outs, _ = run(spec, grammars, SamplingParams(temperature=1.0, max_tokens=60, seed=seed))
    for toks, reason in outs:
        assert reason == "stop" and allowed(grammars, spec, toks)
