"""The fused CUDA-path kernels compute what the torch reference computes (run here in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from specops.models import kernels, ops
from specops.models.attention import TorchAttention, TritonAttention
from specops.models.kv_cache import KVCache

pytestmark = pytest.mark.skipif(not kernels.available(), reason="Triton is not installed")

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def rnd(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_and_silu_mul_match_the_reference(dtype):
    x, r, w = rnd(5, 96, dtype=dtype), rnd(5, 96, dtype=dtype, seed=1), rnd(96, dtype=dtype, seed=2)
    normed, residual = kernels.add_rms_norm(x, r, w, 1e-6)
    ref_normed, ref_residual = ops.add_rms_norm(x, r, w, 1e-6)  # CPU tensors: the torch reference
    torch.testing.assert_close(residual, ref_residual, **TOL[dtype])
    torch.testing.assert_close(normed, ref_normed, **TOL[dtype])
    torch.testing.assert_close(kernels.add_rms_norm(x, None, w, 1e-6)[0], ops.rms_norm(x, w, 1e-6), **TOL[dtype])
    gu = rnd(3, 2 * 80, dtype=dtype, seed=3)
    torch.testing.assert_close(kernels.silu_mul(gu), ops.silu_mul(gu), **TOL[dtype])


class Rope:
    """A rotary table like ``Rotary``'s: cos/sin [max_len, head_dim] in float32."""

    def __init__(self, max_len: int, head_dim: int):
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        freqs = torch.outer(torch.arange(max_len).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def tables(self, positions, dtype):
        return self.cos[positions].unsqueeze(2).to(dtype), self.sin[positions].unsqueeze(2).to(dtype)


def caches(dtype, slots=4, kv=2, max_len=48, d=32):
    """Two caches with the same random history, one for each path."""
    a = KVCache(1, slots, kv, max_len, d, dtype, "cpu")
    a.k.copy_(rnd(*a.k.shape, dtype=dtype, seed=7))
    a.v.copy_(rnd(*a.v.shape, dtype=dtype, seed=8))
    b = KVCache(1, slots, kv, max_len, d, dtype, "cpu")
    b.k.copy_(a.k)
    b.v.copy_(a.v)
    return a, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 4])
def test_row_attention_matches_the_reference(dtype, t):
    """Decode (t = 1) and verification (t = γ + 1) rows at different context lengths, GQA 4 heads on 2."""
    h, kv, d = 4, 2, 32
    slots = torch.tensor([2, 0, 3])
    positions = torch.tensor([[9], [0], [30]]) + torch.arange(t)
    qkv = rnd(3 * t, (h + 2 * kv) * d, dtype=dtype, seed=4)
    rope = Rope(48, d)
    ref_cache, cache = caches(dtype)
    ref = TorchAttention.build(slots, positions)
    want = ref.attend(qkv, h, kv, d, ref_cache, 0, ref.rope(rope, dtype))
    got = TritonAttention.rows(slots, positions).attend(qkv, h, kv, d, cache, 0, rope)
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(cache.k, ref_cache.k, **TOL[dtype])  # k rotated and stored where the reference did
    torch.testing.assert_close(cache.v, ref_cache.v, rtol=0, atol=0)


def test_packed_prefill_matches_padded_rows():
    """Prompts of different lengths back to back, with query blocks that split a prompt, equal padded rows."""
    h, kv, d, dtype = 4, 2, 32, torch.float32
    lengths, slots = [5, 19, 1], [1, 3, 0]
    rope = Rope(48, d)
    ref_cache, cache = caches(dtype)
    qkv = rnd(sum(lengths), (h + 2 * kv) * d, seed=5)
    got = TritonAttention.packed(slots, lengths, "cpu", block_t=8).attend(qkv, h, kv, d, cache, 0, rope)
    start = 0
    for n, slot in zip(lengths, slots):
        meta = TorchAttention.build(torch.tensor([slot]), torch.arange(n)[None])
        want = meta.attend(qkv[start : start + n], h, kv, d, ref_cache, 0, meta.rope(rope, dtype))
        torch.testing.assert_close(got[start : start + n], want, rtol=1e-5, atol=1e-5)
        start += n
    torch.testing.assert_close(cache.k, ref_cache.k, rtol=1e-6, atol=1e-6)


def test_a_query_s_result_does_not_depend_on_its_block():
    """The same query over the same keys gives bit-identical output alone (decode) or inside a longer block
    (verification), which is what keeps speculative decoding token-for-token equal to plain decoding."""
    h, kv, d = 4, 2, 32
    rope = Rope(48, d)
    _, cache = caches(torch.float32)
    qkv = rnd(4, (h + 2 * kv) * d, seed=6)
    block = TritonAttention.rows(torch.tensor([1]), torch.tensor([[12, 13, 14, 15]])).attend(qkv, h, kv, d, cache, 0,
                                                                                            rope)
    single = TritonAttention.rows(torch.tensor([1]), torch.tensor([[12]])).attend(qkv[:1], h, kv, d, cache, 0, rope)
    assert torch.equal(block[:1], single)


@pytest.mark.parametrize("t", [1, 4])
def test_split_key_attention_matches_and_is_block_invariant(t, monkeypatch):
    """Keys split into fixed chunks (as decode steps at small batch run): the reference's result, and a query
    alone gives bit for bit what it gives inside a verification block."""
    monkeypatch.setattr(kernels, "SPLIT_BELOW", 1 << 20)
    monkeypatch.setattr(kernels, "SPLIT_CHUNK", 16)
    h, kv, d = 4, 2, 32
    slots = torch.tensor([2, 0])
    positions = torch.tensor([[20], [3]]) + torch.arange(t)
    qkv = rnd(2 * t, (h + 2 * kv) * d, seed=9)
    rope = Rope(48, d)
    ref_cache, cache = caches(torch.float32)
    ref = TorchAttention.build(slots, positions)
    want = ref.attend(qkv, h, kv, d, ref_cache, 0, ref.rope(rope, torch.float32))
    got = TritonAttention.rows(slots, positions).attend(qkv, h, kv, d, cache, 0, rope)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    alone = TritonAttention.rows(slots[:1], positions[:1, :1]).attend(qkv[:1], h, kv, d, cache, 0, rope)
    assert torch.equal(alone, got[:1])
