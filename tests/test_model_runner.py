"""The model runner's step functions on the CPU: bucket padding and the fused path change no output, the device
random numbers are well-behaved, and batched verification equals a row-by-row reference verifier."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import bigram_draft, make_target
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import kstest

from specops.engine.engine import Engine
from specops.engine.model_runner import buckets, prefill_shape, prefill_shapes
from specops.engine.sampling import SamplingParams, logits_to_probs, sample_from, uniforms
from specops.engine.scheduler import Scheduler
from specops.engine.verify import verify
from specops.models import kernels


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = tmp_path_factory.mktemp("runner-target")
    return d, make_target(d, seed=3, bigram=0.005, kv_heads=2)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 48, (int(k),), generator=g).tolist() for k in torch.randint(2, 12, (n,), generator=g)]


def build(model_dir, hf, gamma: int, **kw) -> Engine:
    base = Engine.load(model_dir, gamma=0, max_batch=8, max_seq_len=64)
    draft = bigram_draft(hf, base.model) if gamma else None
    return Engine(base.model, base.tokenizer, draft=draft, gamma=gamma, max_batch=8, max_seq_len=64,
                  eos_token_ids=base.eos_token_ids, **kw)


def run(engine: Engine, ps, params) -> list:
    return [(o.token_ids, o.spec.to_dict()) for o in engine.generate(ps, params)]


def test_buckets_cover_every_batch_size():
    assert buckets(1) == [1] and buckets(8) == [1, 2, 4, 8] and buckets(12) == [1, 2, 4, 8, 12]


@pytest.mark.parametrize("gamma", [0, 3])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_bucket_padding_never_changes_outputs(target, gamma, temperature):
    """Five requests padded to a batch of 8 (three rows on the scratch slot), then fewer as they finish."""
    model_dir, hf = target
    ps = prompts(5)
    params = [SamplingParams(temperature=temperature, top_k=20 if i % 2 else 0, max_tokens=8 + 3 * i, seed=i)
              for i in range(5)]
    exact = run(build(model_dir, hf, gamma), ps, params)
    padded_engine = build(model_dir, hf, gamma, bucket_padding=True)
    assert padded_engine.runner.buckets == [1, 2, 4, 8]
    assert run(padded_engine, ps, params) == exact


@pytest.mark.parametrize("gamma", [0, 3])
def test_overlapped_rounds_give_the_synchronous_outputs(target, gamma):
    """Queuing each round before reading the last (what CUDA does): more requests than slots, so requests join
    while others run and finished ones get a round nobody reads, and prefills are read a step late; outputs and
    counters are unchanged."""
    model_dir, hf = target
    ps = prompts(11, seed=2)
    # Some end on their first token, which overlapped steps read only after the request joined the next round.
    params = [SamplingParams(temperature=0.7 if i % 3 else 0.0, max_tokens=1 if i % 4 == 1 else 5 + 2 * i, seed=i)
              for i in range(11)]
    sync = build(model_dir, hf, gamma)
    assert not sync.overlap
    overlapped = build(model_dir, hf, gamma, overlap=True)
    assert run(overlapped, ps, params) == run(sync, ps, params)
    assert overlapped.stats == sync.stats


@pytest.mark.skipif(not kernels.available(), reason="Triton is not installed")
@pytest.mark.parametrize("gamma", [0, 3])
def test_fused_path_equals_the_reference_path(target, gamma, monkeypatch):
    """The CUDA path's kernels, packed prefill and padded rounds (in Triton's interpreter) give the torch path's
    tokens: greedy and seeded sampling."""
    model_dir, hf = target
    ps = prompts(3, seed=1)
    params = [SamplingParams(temperature=0.0, max_tokens=10), SamplingParams(temperature=0.9, max_tokens=10, seed=4),
              SamplingParams(temperature=0.0, max_tokens=6)]
    reference = run(build(model_dir, hf, gamma), ps, params)
    monkeypatch.setenv("SPECOPS_FUSED_KERNELS", "1")
    fused = build(model_dir, hf, gamma, bucket_padding=True)
    assert fused.runner.fused and not fused.runner.use_graphs
    assert run(fused, ps, params) == reference


def test_prefill_shapes_hold_the_prompts_and_a_padding_token():
    assert prefill_shapes(8)[:4] == [(16, 1), (32, 2), (64, 4), (128, 8)] and prefill_shapes(8)[-1] == (2048, 8)
    assert prefill_shape([15], 8) == (16, 1)
    assert prefill_shape([16], 8) == (32, 2)  # a full bucket leaves no token for padding rows to point at
    assert prefill_shape([3, 4], 8) == (32, 2) and prefill_shape([3, 4, 2], 8) == (64, 4)
    assert prefill_shape([1] * 8, 8) == (128, 8) and prefill_shape([1] * 9, 8) is None
    assert prefill_shape([2047], 8) == (2048, 8) and prefill_shape([2048], 8) is None


@pytest.mark.skipif(not kernels.available(), reason="Triton is not installed")
def test_padded_prefills_overlapped_equal_the_reference_path(target, monkeypatch):
    """Prefills padded to the token buckets CUDA graphs replay (eight prompts, then the rest as slots free up),
    read a step late, and a top-k row that takes the unpadded path: the torch path's tokens."""
    model_dir, hf = target
    ps = prompts(10, seed=7)
    params = [SamplingParams(temperature=0.8 if i % 2 else 0.0, top_k=5 if i == 8 else 0, max_tokens=2 + i % 3,
                             seed=i) for i in range(len(ps))]
    reference = run(build(model_dir, hf, 3), ps, params)
    monkeypatch.setenv("SPECOPS_FUSED_KERNELS", "1")
    padded = build(model_dir, hf, 3, bucket_padding=True, overlap=True)
    staged = []
    stage = padded.runner._stage_prefill
    padded.runner._stage_prefill = lambda shape, *a: staged.append(shape) or stage(shape, *a)
    assert run(padded, ps, params) == reference
    assert staged[0] == (128, 8) and len(staged) >= 2


def test_uniforms_are_a_function_of_seed_round_and_index():
    seeds = torch.tensor([0, 1, 2**62 + 5, 12345])
    rounds = torch.tensor([0, 0, 7, 3])
    u = uniforms(seeds, rounds, 9)
    assert u.shape == (4, 9) and float(u.min()) >= 0 and float(u.max()) < 1
    assert torch.equal(u[2:3], uniforms(seeds[2:3], rounds[2:3], 9))  # a row depends on nothing else
    assert not torch.equal(u[0], u[1]) and not torch.equal(uniforms(seeds, rounds + 1, 9), u)
    many = uniforms(torch.arange(2000), torch.zeros(2000, dtype=torch.long), 8).flatten().numpy()
    assert kstest(many, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(many[0::8], many[1::8])[0, 1]) < 0.05  # neighbouring draws are not correlated


def reference_verify(p: np.ndarray, q: np.ndarray, drafts: list[int], greedy: bool, u: list[float], u_last: float):
    """Leviathan et al. row by row: accept draft x with probability min(1, p(x)/q(x)); at the first rejection
    sample from norm(max(0, p - q)), after the last draft from p (greedy: argmax comparisons)."""
    out = []
    for i, x in enumerate(drafts):
        if greedy:
            ok = int(p[i].argmax()) == x
        else:
            ok = q[i, x] > 0 and u[i] < min(1.0, p[i, x] / q[i, x])
        if not ok:
            if greedy:
                return i, out + [int(p[i].argmax())]
            r = np.maximum(p[i] - q[i], 0)
            r = r / r.sum() if r.sum() > 0 else p[i]
            return i, out + [int(sample_from(torch.tensor(r), torch.tensor(u_last)))]
        out.append(x)
    last = p[len(drafts)]
    return len(drafts), out + [int(last.argmax()) if greedy else int(sample_from(torch.tensor(last),
                                                                                  torch.tensor(u_last)))]


@pytest.mark.parametrize("seed", range(5))
def test_batched_verification_equals_the_row_reference(seed):
    g = torch.Generator().manual_seed(seed)
    b, gamma, v = 6, 3, 11
    logits = torch.randn(b, gamma + 1, v, generator=g) * 2
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.0, 1.3, 0.9])
    probs = logits_to_probs(logits, temperature, torch.tensor([0, 0, 4, 0, 0, 0]), torch.tensor([1, 1, 1, 1, .8, 1.]))
    q = torch.softmax(torch.randn(b, gamma, v, generator=g), -1)
    drafts = torch.stack([sample_from(q[:, k], torch.rand(b, generator=g)) for k in range(gamma)], 1)
    drafts[0] = logits[0, :gamma].argmax(-1)  # a greedy row that accepts everything
    u = uniforms(torch.arange(b) + 100 * seed, torch.zeros(b, dtype=torch.long), gamma + 1)
    greedy = temperature == 0
    n, out = verify(logits, probs, drafts, q, greedy, u[:, :gamma], u[:, gamma])
    for i in range(b):
        k, tokens = reference_verify(probs[i].numpy(), q[i].numpy(), drafts[i].tolist(),
                                     bool(greedy[i]), u[i, :gamma].tolist(), float(u[i, gamma]))
        assert (int(n[i]), out[i, : k + 1].tolist()) == (k, tokens)


def test_overlapped_abort_frees_the_slot_for_a_new_request(target):
    """A request aborted while its round is queued emits nothing more, and the request that takes its slot
    decodes as it would alone."""
    model_dir, hf = target
    eng = build(model_dir, hf, 3, overlap=True)
    p = prompts(3, seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=20)
    for i in range(2):
        eng.add_request(f"r{i}", p[i], params)
    seen: dict[str, list[int]] = {"r0": [], "r1": [], "r2": []}
    for _ in range(3):
        for so in eng.step():
            seen[so.request_id] += so.new_token_ids
    assert eng._inflight is not None
    eng.abort("r0")
    before = list(seen["r0"])
    eng.add_request("r2", p[2], params)
    done = {}
    while eng.has_unfinished():
        for so in eng.step():
            seen[so.request_id] += so.new_token_ids
            if so.finished:
                done[so.request_id] = so.output.token_ids
    assert seen["r0"] == before and "r0" not in done
    alone = build(model_dir, hf, 3).generate([p[2]], params)[0].token_ids
    assert done["r2"] == alone and seen["r2"] == alone


@pytest.mark.parametrize("overlap", [False, True])
def test_provenance_accounts_for_every_token_and_counter(target, overlap):
    """Per round: the drafts proposed, how many were kept, what the round produced and how much of it was
    emitted; together they rebuild the output and the request's counters exactly."""
    model_dir, hf = target
    ps = prompts(6, seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * i) for i in range(6)]
    outs = build(model_dir, hf, 3, overlap=overlap).generate(ps, params, provenance=True)
    for o in outs:
        rounds = o.provenance
        assert o.token_ids[:1] + [t for r in rounds for t in r["tokens"][: r["emitted"]]] == o.token_ids
        assert len(rounds) == o.spec.num_drafts
        assert sum(r["accepted"] for r in rounds) == o.spec.num_accepted_tokens
        for r in rounds:
            k = r["accepted"]
            assert r["tokens"][:k] == r["drafts"][:k] and len(r["tokens"]) == k + 1
            if k < 3:  # greedy: the target's correction differs from the draft it rejected
                assert r["tokens"][k] != r["drafts"][k]


@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12), slots=st.integers(1, 12),
       limit=st.tuples(st.integers(2, 64), st.integers(1, 6)))
@settings(max_examples=200, deadline=None)
def test_admission_keeps_each_prefill_within_the_limit(lengths, slots, limit):
    """Each step admits, in arrival order, a group that fits the largest padded prefill (fewer than n tokens, at
    most r prompts) or one prompt alone, and never leaves a free slot idle while the group has room."""
    sched = Scheduler(slots, 64, 64, [2], None)
    for i, n in enumerate(lengths):
        sched.add(f"r{i}", [5] * n, SamplingParams(temperature=0.0))
    order = []
    while sched.waiting:
        group = sched.admit(limit)
        assert group, "a step with free slots admits at least one request"
        total = sum(len(r.prompt) for r in group)
        assert len(group) == 1 or (total < limit[0] and len(group) <= limit[1])
        nxt = sched.waiting[0] if sched.waiting else None
        if nxt is not None and sched.free_slots:  # stopped by the limit, not by the slots
            assert total + len(nxt.prompt) >= limit[0] or len(group) == limit[1]
        order += [r.request_id for r in group]
        for r in group:
            sched.abort(r.request_id)
    assert order == [f"r{i}" for i in range(len(lengths))]


@pytest.mark.skipif(not kernels.available(), reason="Triton is not installed")
def test_bursts_larger_than_every_padded_prefill_are_admitted_in_groups(target, monkeypatch):
    """Eight prompts at once against padded prefills of at most 64 tokens: they are admitted over several steps,
    each group padded (no prefill runs unpadded), and the tokens are the torch path's."""
    import specops.engine.model_runner as mr

    model_dir, hf = target
    ps = [p * 3 for p in prompts(8, seed=5)]  # 6..33 tokens each, about 150 in all
    params = [SamplingParams(temperature=0.8 if i % 2 else 0.0, max_tokens=4, seed=i) for i in range(len(ps))]
    reference = run(build(model_dir, hf, 3), ps, params)
    monkeypatch.setenv("SPECOPS_FUSED_KERNELS", "1")
    monkeypatch.setattr(mr, "PREFILL_TOKENS", [16, 32, 64])
    padded = build(model_dir, hf, 3, bucket_padding=True)
    assert padded.runner.prefill_limit == (64, 4)
    staged, eager = [], []
    stage, unpadded = padded.runner._stage_prefill, padded.runner._prefill_eager
    padded.runner._stage_prefill = lambda shape, *a: staged.append(shape) or stage(shape, *a)
    padded.runner._prefill_eager = lambda *a: eager.append(a) or unpadded(*a)
    assert run(padded, ps, params) == reference
    assert not eager and len(staged) >= 3
