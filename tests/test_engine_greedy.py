"""Greedy outputs of the engine equal transformers' own greedy ``generate``, with and without speculation."""

from pathlib import Path

import pytest
import torch

from engine_helpers import bigram_draft, make_target
from specops.engine import Engine, SamplingParams
from specops.models.eagle3 import Eagle3Draft

MAX_NEW = 24
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny" / "target-merged"


_REFS: dict = {}


def hf_greedy(model, prompt, max_new, eos):
    """transformers' greedy continuation, memoised: several tests share prompts."""
    key = (id(model), tuple(prompt), max_new, tuple(eos))
    if key not in _REFS:
        _REFS[key] = _hf_greedy(model, prompt, max_new, eos)
    return _REFS[key]


def _hf_greedy(model, prompt, max_new, eos):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                         pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def prompts(n, vocab, seed=0, lo=2, hi=14):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lens]


@pytest.fixture(scope="module")
def random_target(tmp_path_factory):
    d = tmp_path_factory.mktemp("random-target")
    hf = make_target(d, seed=0)
    return d, hf


@pytest.fixture(scope="module")
def bigram_target(tmp_path_factory):
    d = tmp_path_factory.mktemp("bigram-target")
    hf = make_target(d, seed=3, bigram=0.005, kv_heads=2)
    return d, hf


def engine(model_dir, hf, draft_kind, gamma, max_batch=8):
    base = Engine.load(model_dir, gamma=gamma, max_batch=max_batch, max_seq_len=96)
    draft = None
    if draft_kind == "random":
        draft = Eagle3Draft.random(base.model.config, seed=0)
    elif draft_kind == "bigram":
        draft = bigram_draft(hf, base.model)
    return Engine(base.model, base.tokenizer, draft=draft, gamma=gamma, max_batch=max_batch, max_seq_len=96,
                  eos_token_ids=base.eos_token_ids)


@pytest.mark.parametrize("gamma", [0, 1, 3, 5])
@pytest.mark.parametrize("kind", ["random", "bigram"])
def test_greedy_parity_batch_of_8_mixed_lengths(random_target, bigram_target, kind, gamma):
    model_dir, hf = random_target if kind == "random" else bigram_target
    ps = prompts(8, 48, seed=0)
    eng = engine(model_dir, hf, kind, gamma)
    outs = eng.generate(ps, SamplingParams(temperature=0, max_tokens=MAX_NEW))
    for p, o in zip(ps, outs):
        assert o.token_ids == hf_greedy(hf, p, MAX_NEW, eng.eos_token_ids)
        assert o.prompt_token_ids == p
    s = eng.stats
    if gamma == 0:
        assert s.num_drafts == 0
    else:
        assert s.num_draft_tokens == gamma * s.num_drafts
        assert sum(s.accepted_per_pos) == s.num_accepted_tokens
        assert all(a >= b for a, b in zip(s.accepted_per_pos, s.accepted_per_pos[1:]))
        assert sum(o.spec.num_drafts for o in outs) == s.num_drafts
        if kind == "bigram":  # long accepted runs, full acceptance + bonus included
            assert s.accepted_per_pos[-1] > 0
            assert s.mean_acceptance_length > min(2.0, 1 + 0.5 * gamma)


@pytest.mark.parametrize("gamma", [0, 3])
def test_greedy_parity_batch_1(bigram_target, gamma):
    model_dir, hf = bigram_target
    eng = engine(model_dir, hf, "bigram", gamma, max_batch=1)
    for p in prompts(8, 48, seed=0)[:3]:
        [o] = eng.generate([p], SamplingParams(temperature=0, max_tokens=MAX_NEW))
        assert o.token_ids == hf_greedy(hf, p, MAX_NEW, eng.eos_token_ids)


def test_eos_ends_output_like_hf(random_target):
    """Declare a token the model is known to emit as EOS: both stop right after it, the EOS included."""
    model_dir, hf = random_target
    p = prompts(1, 48, seed=11)[0]
    free = hf_greedy(hf, p, MAX_NEW, eos=[])
    eos = free[5]
    ref = hf_greedy(hf, p, MAX_NEW, eos=[eos])
    base = engine(model_dir, hf, "random", 3)
    eng = Engine(base.model, base.tokenizer, draft=base.draft, gamma=3, max_seq_len=96, eos_token_ids=[eos])
    [o] = eng.generate([p], SamplingParams(temperature=0, max_tokens=MAX_NEW))
    assert o.token_ids == ref and o.token_ids[-1] == eos and o.finish_reason == "stop"
    [o] = eng.generate([p], SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))
    assert o.token_ids == free and o.finish_reason == "length"


def test_more_requests_than_slots_join_as_slots_free(bigram_target):
    model_dir, hf = bigram_target
    ps = prompts(7, 48, seed=5)
    maxes = [3, 9, 1, 17, 5, 12, 2]
    eng = engine(model_dir, hf, "bigram", 3, max_batch=3)
    outs = eng.generate(ps, [SamplingParams(temperature=0, max_tokens=m) for m in maxes])
    for p, m, o in zip(ps, maxes, outs):
        ref = hf_greedy(hf, p, m, eng.eos_token_ids)
        assert o.token_ids == ref
        assert o.finish_reason == ("stop" if ref[-1] in eng.eos_token_ids else "length")
    assert not eng.has_unfinished() and sorted(eng.free_slots) == [0, 1, 2]


@pytest.mark.skipif(not (FIXTURE / "config.json").is_file(), reason=f"fixture not built: {FIXTURE}")
@pytest.mark.parametrize("gamma", [0, 3])
def test_greedy_parity_on_commerce_fixture(gamma):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(FIXTURE), dtype=torch.float32).eval()
    base = Engine.load(FIXTURE, gamma=gamma, max_seq_len=512)
    draft = Eagle3Draft.random(base.model.config, seed=0) if gamma else None
    eng = Engine(base.model, base.tokenizer, draft=draft, gamma=gamma, max_seq_len=512,
                 eos_token_ids=base.eos_token_ids)
    tok = eng.tokenizer
    texts = ["red running shoes under 80 dollars", "a laptop bag", "wireless earbuds with noise cancelling"]
    ps = [tok(t)["input_ids"] for t in texts]
    outs = eng.generate(ps, SamplingParams(temperature=0, max_tokens=32))
    for p, o in zip(ps, outs):
        assert o.token_ids == hf_greedy(hf, p, 32, eng.eos_token_ids)
