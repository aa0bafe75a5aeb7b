"""Triton kernels for the CUDA path: the small operations between the weight matmuls, fused.

At batch 1 a decode step reads the weights once; what keeps it from the memory-bandwidth bound is the number of
small kernels around the matmuls. Per layer these four replace about fifteen: residual add + RMSNorm, rotary
embedding of q and k + the cache write of k and v, attention over the live context read straight from the static
cache, and SiLU(gate) · up. Each computes in float32 and rounds where the reference torch ops
(``models.ops``, what the CPU runs) round, so both paths compute the same function.

Every kernel has a fixed launch shape for a fixed batch shape and reads lengths and positions from device
memory, so a whole step can be captured as one CUDA graph. With ``TRITON_INTERPRET=1`` they run on CPU tensors;
``SPECOPS_FUSED_KERNELS=1`` then makes the engine use them on the CPU too, which is how the tests check the whole
fused path against the torch reference without a GPU.
"""

from __future__ import annotations

import math
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU path needs none of this
    triton = None


def available() -> bool:
    return triton is not None


def enabled(device: torch.device) -> bool:
    """Whether work on ``device`` runs the kernels: on CUDA when Triton is installed (or anywhere, forced)."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("SPECOPS_FUSED_KERNELS") == "1"


def supports(head_dim: int) -> bool:
    """The kernels tile a head in one block: head_dim must be a power of two."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


if triton is not None:

    @triton.jit
    def _add_rms_norm(X, R, W, OUT, RES_OUT, n_cols, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            x = x + tl.load(R + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
            x = x.to(RES_OUT.dtype.element_ty)  # the residual stream is kept in the model dtype
            tl.store(RES_OUT + row * n_cols + cols, x, mask=m)
            x = x.to(tl.float32)
        var = tl.sum(x * x, axis=0) / n_cols
        y = (x * (1.0 / tl.sqrt(var + eps))).to(OUT.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(OUT + row * n_cols + cols, (w * y).to(OUT.dtype.element_ty), mask=m)

    @triton.jit
    def _silu_mul(GU, OUT, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < n_cols
        g = tl.load(GU + row * 2 * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(GU + row * 2 * n_cols + n_cols + cols, mask=m, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
        tl.store(OUT + row * n_cols + cols, (s * u).to(OUT.dtype.element_ty), mask=m)

    @triton.jit
    def _rope_store(QKV, Q, KC, VC, POS, SLOT, COS, SIN, stride_tok, stride_slot, stride_kvh, stride_pos,
                    N_HEADS: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr):
        """One program per (token, q or k head): rotate it; k heads also store k and v into the cache."""
        tok = tl.program_id(0)
        head = tl.program_id(1)
        half: tl.constexpr = HEAD_DIM // 2
        d = tl.arange(0, half)
        pos = tl.load(POS + tok)
        cos = tl.load(COS + pos * HEAD_DIM + d)
        sin = tl.load(SIN + pos * HEAD_DIM + d)
        base = QKV + tok * stride_tok + head * HEAD_DIM
        x1 = tl.load(base + d).to(tl.float32)
        x2 = tl.load(base + half + d).to(tl.float32)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        if head < N_HEADS:
            out = Q + (tok * N_HEADS + head) * HEAD_DIM
            tl.store(out + d, y1.to(Q.dtype.element_ty))
            tl.store(out + half + d, y2.to(Q.dtype.element_ty))
        else:
            kvh = head - N_HEADS
            slot = tl.load(SLOT + tok)
            at = slot * stride_slot + kvh * stride_kvh + pos * stride_pos
            tl.store(KC + at + d, y1.to(KC.dtype.element_ty))
            tl.store(KC + at + half + d, y2.to(KC.dtype.element_ty))
            v = QKV + tok * stride_tok + (N_HEADS + N_KV + kvh) * HEAD_DIM
            dd = tl.arange(0, HEAD_DIM)
            tl.store(VC + at + dd, tl.load(v + dd).to(VC.dtype.element_ty))

    @triton.jit
    def _cached_attention(Q, KC, VC, O, WS_ACC, WS_ML, SEQ_SLOT, SEQ_POS0, SEQ_QSTART, SEQ_QLEN, BLK_SEQ, BLK_Q0,
                          stride_slot, stride_kvh, stride_pos, sm_scale,
                          N_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                          SPLITS: tl.constexpr, CHUNK: tl.constexpr, IEEE: tl.constexpr):
        """One program per (query block, kv head, key chunk). A query block is up to BLOCK_T consecutive query tokens
        of one sequence; its tile rows are (token, query head of this kv head) pairs. Query token i of a sequence sits
        at position pos0 + i and attends every cached key of its slot at a position <= its own (online softmax).

        With SPLITS > 1 program z covers only keys [z·CHUNK, (z+1)·CHUNK) and writes its partial (acc, max, sum)
        to the workspace for ``_combine``; chunk boundaries are fixed, so a query's result does not depend on the
        other queries of its block (decode and verification compute the same numbers)."""
        blk = tl.program_id(0)
        kvh = tl.program_id(1)
        z = tl.program_id(2)
        seq = tl.load(BLK_SEQ + blk)
        q0 = tl.load(BLK_Q0 + blk)
        slot = tl.load(SEQ_SLOT + seq)
        pos0 = tl.load(SEQ_POS0 + seq)
        qstart = tl.load(SEQ_QSTART + seq)
        qlen = tl.load(SEQ_QLEN + seq)
        r = tl.arange(0, BLOCK_R)
        t = q0 + r // GROUP
        head = kvh * GROUP + r % GROUP
        valid = (r < BLOCK_T * GROUP) & (t < qlen)
        d = tl.arange(0, HEAD_DIM)
        q_ptr = Q + ((qstart + t) * N_HEADS + head)[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(q_ptr, mask=valid[:, None], other=0.0).to(tl.float32)
        last = tl.minimum(q0 + BLOCK_T, qlen) - 1
        qpos = pos0 + tl.where(valid, t, last)  # padding rows copy a real row: finite, never stored
        hi = pos0 + last + 1
        lo = 0
        if SPLITS > 1:
            lo = z * CHUNK
            hi = tl.minimum(hi, lo + CHUNK)
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, HEAD_DIM], tl.float32)
        kv_base = slot * stride_slot + kvh * stride_kvh
        for n0 in range(lo, hi, BLOCK_N):
            kpos = n0 + tl.arange(0, BLOCK_N)
            kmask = kpos < hi
            offs = kv_base + kpos[:, None] * stride_pos + d[None, :]
            k = tl.load(KC + offs, mask=kmask[:, None], other=0.0).to(tl.float32)
            v = tl.load(VC + offs, mask=kmask[:, None], other=0.0).to(tl.float32)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k), input_precision="tf32")  # exact products for bf16/fp16 inputs
            s = s * sm_scale
            s = tl.where(kpos[None, :] <= qpos[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key here yet stays empty
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE:
                pv = tl.dot(p, v, input_precision="ieee")
            else:
                pv = tl.dot(p, v, input_precision="tf32")
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        row = (qstart + t) * N_HEADS + head
        if SPLITS > 1:
            ws = (row * SPLITS + z)
            tl.store(WS_ACC + ws[:, None] * HEAD_DIM + d[None, :], acc, mask=valid[:, None])
            tl.store(WS_ML + ws * 2, m_i, mask=valid)
            tl.store(WS_ML + ws * 2 + 1, l_i, mask=valid)
        else:
            out = acc / l_i[:, None]
            tl.store(O + row[:, None] * HEAD_DIM + d[None, :], out.to(O.dtype.element_ty), mask=valid[:, None])

    @triton.jit
    def _combine(WS_ACC, WS_ML, O, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr):
        """Merge one (token, head)'s key-chunk partials in chunk order."""
        row = tl.program_id(0)
        zs = tl.arange(0, BLOCK_S)
        zmask = zs < SPLITS
        base = row * SPLITS + zs
        m = tl.load(WS_ML + base * 2, mask=zmask, other=float("-inf"))
        lsum = tl.load(WS_ML + base * 2 + 1, mask=zmask, other=0.0)
        top = tl.max(m, axis=0)
        w = tl.exp(m - top)  # chunks without keys for this query weigh 0
        d = tl.arange(0, HEAD_DIM)
        acc = tl.load(WS_ACC + base[:, None] * HEAD_DIM + d[None, :], mask=zmask[:, None], other=0.0)
        out = tl.sum(acc * w[:, None], axis=0) / tl.sum(lsum * w, axis=0)
        tl.store(O + row * HEAD_DIM + d, out.to(O.dtype.element_ty))

# Split-key attention (measured on an H200 at batch 1: 5.9 µs a layer against 6.9 µs unsplit).
SPLIT_BELOW = 64  # split attention over key chunks when fewer (query block, kv head) programs than this
SPLIT_CHUNK = 64


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(weight · rms_norm(x + residual), x + residual); without a residual, (weight · rms_norm(x), x)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    out = torch.empty_like(x2)
    block = _next_pow2(n)
    warps = 8 if block >= 2048 else 4
    if residual is None:
        _add_rms_norm[(x2.shape[0],)](x2, x2, weight, out, out, n, eps, HAS_RES=False, BLOCK=block, num_warps=warps)
        return out.view(x.shape), x
    res_out = torch.empty_like(x2)
    _add_rms_norm[(x2.shape[0],)](x2, residual.reshape(-1, n), weight, out, res_out, n, eps, HAS_RES=True,
                                  BLOCK=block, num_warps=warps)
    return out.view(x.shape), res_out.view(x.shape)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) · up for gate_up = [gate | up] along the last dimension."""
    n = gate_up.shape[-1] // 2
    gu = gate_up.reshape(-1, 2 * n)
    out = torch.empty(gu.shape[0], n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, _next_pow2(n))
    _silu_mul[(gu.shape[0], triton.cdiv(n, block))](gu, out, n, BLOCK=block)
    return out.view(*gate_up.shape[:-1], n)


def rope_store(qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int, n_kv: int, head_dim: int) -> torch.Tensor:
    """Rotate q and k of packed tokens (qkv [N, (H + 2·KV)·D], positions and cache slots [N]); store k and v into
    one layer's cache [slots, KV, max_len, D]; return q [N, H, D]."""
    n = qkv.shape[0]
    q = torch.empty(n, n_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    _rope_store[(n, n_heads + n_kv)](qkv, q, k_cache, v_cache, positions, slots, cos, sin, qkv.stride(0),
                                     k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                     N_HEADS=n_heads, N_KV=n_kv, HEAD_DIM=head_dim)
    return q


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_slot, seq_pos0, seq_qstart,
                     seq_qlen, blk_seq, blk_q0, block_t: int, split: bool = False) -> torch.Tensor:
    """Attention of packed query tokens q [N, H, D] over one layer's cache; the sequence and block tables say which
    tokens belong to which slot and position (``models.attention.TritonAttention`` builds them). → [N, H·D].
    ``split``: allow splitting the keys into fixed chunks (a second, merging kernel) when the grid is small."""
    n, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[1]
    group = n_heads // n_kv
    out = torch.empty_like(q)
    block_r = max(16, _next_pow2(block_t * group))
    block_n = 128 if head_dim <= 64 else 64
    blocks = blk_seq.shape[0]
    splits = 1
    if split and blocks * n_kv < SPLIT_BELOW:
        splits = triton.cdiv(k_cache.shape[2], SPLIT_CHUNK)
        block_n = min(block_n, SPLIT_CHUNK)
    ws_acc = ws_ml = out
    if splits > 1:
        ws_acc = torch.empty(n * n_heads * splits, head_dim, dtype=torch.float32, device=q.device)
        ws_ml = torch.empty(n * n_heads * splits, 2, dtype=torch.float32, device=q.device)
    _cached_attention[(blocks, n_kv, splits)](
        q, k_cache, v_cache, out, ws_acc, ws_ml, seq_slot, seq_pos0, seq_qstart, seq_qlen, blk_seq, blk_q0,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), 1.0 / math.sqrt(head_dim),
        N_HEADS=n_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_T=block_t, BLOCK_R=block_r, BLOCK_N=block_n,
        SPLITS=splits, CHUNK=SPLIT_CHUNK, IEEE=q.dtype == torch.float32,
    )
    if splits > 1:
        _combine[(n * n_heads,)](ws_acc, ws_ml, out, SPLITS=splits, BLOCK_S=_next_pow2(splits), HEAD_DIM=head_dim)
    return out.view(n, n_heads * head_dim)
