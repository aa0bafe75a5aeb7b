"""Greedy outputs of the engine equal transformers' own greedy ``generate``, with and without speculation."""

from pathlib import Path

import pytest
import torch
from engine_helpers import bigram_draft, make_target

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
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
    assert not eng.has_unfinished() and sorted(eng.scheduler.free_slots) == [0, 1, 2]


@pytest.mark.skipif(not (FIXTURE / "config.json").is_file(), reason=f"fixture not built: {FIXTURE}")
@pytest.mark.parametrize("draft_name, gamma", [(None, 0), ("draft-domain", 3), ("draft-general", 5)])
def test_greedy_parity_on_commerce_fixture(draft_name, gamma):
    """The task model with its trained drafts: real chat prompts, JSON answers ending in EOS, real acceptance."""
    from transformers import AutoModelForCausalLM

    from specops.inputs import query_prompt_ids

    hf = AutoModelForCausalLM.from_pretrained(str(FIXTURE), dtype=torch.float32).eval()
    draft = FIXTURE.parent / draft_name if draft_name else None
    eng = Engine.load(FIXTURE, draft=draft, gamma=gamma, max_batch=4, max_seq_len=512)
    queries = ["red running shoes under 80 dollars", "a laptop bag", "wireless earbuds with noise cancelling",
               "送給媽媽的保溫杯，一千元以內"]
    ps = [query_prompt_ids(eng.tokenizer, q) for q in queries]
    outs = eng.generate(ps, SamplingParams(temperature=0, max_tokens=160))
    for p, o in zip(ps, outs):
        assert o.token_ids == hf_greedy(hf, p, 160, eng.eos_token_ids)
    assert all(o.finish_reason == "stop" and o.token_ids[-1] in eng.eos_token_ids for o in outs)
    if draft_name == "draft-domain":  # trained on the task: usually right, mean acceptance length > 2
        assert eng.stats.num_accepted_tokens > eng.stats.num_drafts
    elif draft_name:
        assert eng.stats.num_accepted_tokens > 0


@pytest.mark.skipif(not (FIXTURE.parent / "lora" / "adapter_config.json").is_file(), reason="fixture not built")
def test_fixture_lora_unmerged_equals_merged():
    from specops.inputs import query_prompt_ids

    outs = {}
    for mode in ("merged", "unmerged"):
        eng = Engine.load(FIXTURE.parent / "base", lora=FIXTURE.parent / "lora", lora_mode=mode,
                          draft=FIXTURE.parent / "draft-domain", gamma=3, max_seq_len=512)
        ps = [query_prompt_ids(eng.tokenizer, q) for q in ("blue jeans size 32", "a gaming mouse under 50 euros")]
        outs[mode] = [o.token_ids for o in eng.generate(ps, SamplingParams(temperature=0, max_tokens=64))]
    assert outs["merged"] == outs["unmerged"]
