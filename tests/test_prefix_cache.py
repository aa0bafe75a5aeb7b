"""Prefix caching: which prefixes are kept and used (the host's bookkeeping), and that prompts prefilled from a
cached prefix decode exactly what they decode without one, on the torch path and the fused one (Triton's
interpreter), greedy and sampled, with and without a draft."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import bigram_draft, make_target
from hypothesis import given, settings
from hypothesis import strategies as st

from specops.engine.engine import Engine
from specops.engine.prefix_cache import PrefixCache, common_length
from specops.engine.sampling import SamplingParams
from specops.models import kernels


def test_a_shared_prefix_is_kept_from_the_second_prompt_and_used_from_the_third():
    cache = PrefixCache([10, 11], min_tokens=4)
    system = list(range(100, 120))
    first = cache.plan([system + [1, 2]])
    assert first.hits == [(None, 0)] and first.keep == []  # nothing to compare with yet
    second = cache.plan([system + [3, 4, 5]])
    # 20 shared tokens key a prefix of 19 positions: the draft's position 18 reads token 19
    assert second.hits == [(None, 0)] and second.keep == [(0, 19, 10)]
    third = cache.plan([system + [6], system[:10]])  # the second starts from the first 9 positions of the same
    assert third.hits == [(10, 19), (10, 9)] and third.keep == []
    assert cache.uncached(system + [7, 8]) == 3 and cache.uncached(system) == 1 and cache.uncached([5]) == 1
    assert cache.uncached(system[:4] + [7]) == 5  # 3 positions: fewer than min_tokens


def test_a_prefix_kept_in_a_prefill_is_used_only_by_later_ones():
    cache = PrefixCache([10], min_tokens=4)
    shared = list(range(50, 70))
    plan = cache.plan([shared + [1], shared + [2], shared + [3]])
    assert plan.hits == [(None, 0)] * 3 and plan.keep == [(1, 19, 10)]
    assert cache.plan([shared + [4]]).hits == [(10, 19)]


def test_prompts_that_share_a_few_more_tokens_take_no_slot_of_their_own():
    cache = PrefixCache([10, 11], min_tokens=4)
    system = list(range(100, 120))
    cache.plan([system + [1, 9, 9]])
    cache.plan([system + [2, 9, 9]])
    plan = cache.plan([system + [1, 9, 8]])  # 3 tokens beyond the kept prefix: fewer than min_tokens more
    assert plan.hits == [(10, 19)] and plan.keep == [] and cache.free == [11]


def test_the_least_recently_used_prefix_makes_room():
    cache = PrefixCache([10], min_tokens=2)
    a, b = [1] * 8, [2] * 8
    cache.plan([a + [3]]), cache.plan([a + [4]])  # keeps a in slot 10
    cache.plan([b + [3]]), cache.plan([b + [4]])  # keeps b in its place
    assert [(p.slot, p.key) for p in cache.prefixes] == [(10, tuple(b))]
    assert cache.plan([a + [5]]).hits == [(None, 0)]


@given(prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), min_size=1, max_size=30),
       batch=st.integers(1, 4), slots=st.integers(1, 3), min_tokens=st.integers(1, 6))
@settings(max_examples=150, deadline=None)
def test_every_hit_is_a_prefix_of_its_prompt_filled_by_an_earlier_prefill(prompts, batch, slots, min_tokens):
    """Whatever the prompts: a prompt starts from a prefix whose key it begins with, leaving at least one token to
    compute; that prefix was kept by an earlier prefill, from a row that began with the same tokens; slots are never
    shared by two prefixes."""
    cache = PrefixCache(list(range(100, 100 + slots)), min_tokens)
    filled: dict[int, tuple] = {}  # slot -> the tokens its positions hold, as of the last prefill
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        plan = cache.plan(group)
        for prompt, (slot, k) in zip(group, plan.hits):
            assert 0 <= k < len(prompt)
            if slot is not None:
                assert filled[slot][: k + 1] == tuple(prompt[: k + 1]) and k >= min_tokens
            else:
                assert k == 0
        for row, k, slot in plan.keep:
            filled[slot] = tuple(group[row][: k + 1])
        owned = [p.slot for p in cache.prefixes]
        assert len(owned) == len(set(owned)) and set(owned) | set(cache.free) <= set(range(100, 100 + slots))


@given(a=st.lists(st.integers(0, 2), max_size=40), b=st.lists(st.integers(0, 2), max_size=40))
def test_common_length_is_the_longest_common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_length(tuple(a), tuple(b)) == n


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefix-target")
    return d, make_target(d, seed=5, bigram=0.005, kv_heads=2)


def build(model_dir, hf, gamma: int, **kw) -> Engine:
    base = Engine.load(model_dir, gamma=0, max_batch=8, max_seq_len=64)
    draft = bigram_draft(hf, base.model) if gamma else None
    return Engine(base.model, base.tokenizer, draft=draft, gamma=gamma, max_batch=8, max_seq_len=64,
                  eos_token_ids=base.eos_token_ids, **kw)


def shared_prompts(n: int, seed: int) -> list[list[int]]:
    """A 24-token "system prompt", then each prompt's own 2–8 tokens."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(3, 48, (24,), generator=g).tolist()
    return [system + torch.randint(3, 48, (int(k),), generator=g).tolist()
            for k in torch.randint(2, 9, (n,), generator=g)]


def params_for(n: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.8 if i % 2 else 0.0, max_tokens=6 + i % 3, seed=i) for i in range(n)]


def decode(engine: Engine, prompts, params, waves: int = 3) -> list:
    """The prompts in waves (a later wave can use what an earlier one kept), each output's tokens and counters."""
    step = -(-len(prompts) // waves)
    out = []
    for i in range(0, len(prompts), step):
        out += [(o.token_ids, o.spec.to_dict()) for o in engine.generate(prompts[i : i + step], params[i : i + step])]
    return out


@pytest.mark.parametrize("gamma", [0, 3])
def test_prompts_decode_the_same_with_a_cached_prefix(target, gamma):
    model_dir, hf = target
    prompts, params = shared_prompts(9, seed=1), params_for(9)
    reference = decode(build(model_dir, hf, gamma, prefix_cache=False), prompts, params)
    cached = build(model_dir, hf, gamma)
    computed = []
    prefill = cached.runner._prefill_eager
    cached.runner._prefill_eager = lambda slots, ps, *a: computed.extend(map(len, ps)) or prefill(slots, ps, *a)
    assert decode(cached, prompts, params) == reference
    assert [p.length for p in cached.runner.prefixes.prefixes] == [23]
    assert sum(computed) < sum(map(len, prompts)) - 23 * 5  # the last two waves computed their own tokens only


@pytest.mark.skipif(not kernels.available(), reason="Triton is not installed")
def test_padded_prefills_from_a_cached_prefix_decode_the_same(target, monkeypatch):
    """The fused path (Triton's interpreter): prompts that start from a cached prefix give the torch path's tokens,
    in prefills padded to the buckets CUDA graphs replay (a smaller bucket holds them) and in packed prefills that
    run unpadded (a top-k row)."""
    model_dir, hf = target
    prompts, params = shared_prompts(9, seed=2), params_for(9)
    params[7] = SamplingParams(temperature=0.7, top_k=5, max_tokens=6, seed=7)
    reference = decode(build(model_dir, hf, 3, prefix_cache=False), prompts, params)
    monkeypatch.setenv("SPECOPS_FUSED_KERNELS", "1")
    padded = build(model_dir, hf, 3, bucket_padding=True)
    staged, unpadded = [], []
    stage, eager = padded.runner._stage_prefill, padded.runner._prefill_eager
    padded.runner._stage_prefill = lambda shape, *a: staged.append(shape) or stage(shape, *a)
    padded.runner._prefill_eager = lambda slots, ps, offsets, *a: unpadded.append(offsets) or eager(slots, ps,
                                                                                                  offsets, *a)
    assert decode(padded, prompts, params) == reference
    # 3 whole prompts (26–32 tokens each), 3 suffixes of 3–9 tokens, then the wave with the top-k row, unpadded
    assert staged == [(128, 8), (64, 4)] and unpadded == [[23, 23, 23]]
