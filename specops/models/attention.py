"""Attention over the static KV cache, and the per-forward metadata it needs: one object per forward, shared by
every layer (and by the draft's first pass, which runs over the same tokens).

Both kinds store k/v at (slot, position) and let a query attend every cached key of its slot whose position is
<= its own. That rule makes padding and rejected speculative tokens harmless: they sit at positions beyond a row's
valid length and are overwritten before any later query can reach them, so rollback is only a length reset.

- ``TorchAttention``: torch ops over [B, T] rows (rotary, an index write, SDPA over the keys up to the batch's
  longest position). The reference, and what the CPU runs; building it reads positions on the host.
- ``TritonAttention``: the fused kernels over packed tokens, reading only each row's live context; its tables
  are device tensors built without a host sync, so a step using it can be captured as a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specops.models import kernels
from specops.models.kv_cache import KVCache
from specops.models.ops import upload


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@dataclass
class TorchAttention:
    """Rows of T tokens each: ``slots`` [B], ``positions`` [B, T]. ``read`` indexes the cache rows to attend over:
    a slice (a view, no copy) when the batch's slots are consecutive in order, else the slot tensor (a gather);
    keys are read up to the largest query position, which bounds work by the live context."""

    slots: torch.Tensor
    positions: torch.Tensor
    read: slice | torch.Tensor
    span: int
    mask: torch.Tensor  # [B, 1, T, span] bool

    @classmethod
    def build(cls, slots: torch.Tensor, positions: torch.Tensor) -> "TorchAttention":
        ids = slots.tolist()
        consecutive = ids == list(range(ids[0], ids[0] + len(ids)))
        read = slice(ids[0], ids[0] + len(ids)) if consecutive else slots
        span = int(positions.max()) + 1
        key_pos = torch.arange(span, device=positions.device)
        mask = key_pos.view(1, 1, 1, span) <= positions.view(positions.shape[0], 1, -1, 1)
        return cls(slots, positions, read, span, mask)

    def rope(self, rotary, dtype: torch.dtype):
        """What ``attend`` needs of a model's rotary embedding, looked up once per forward."""
        return rotary.tables(self.positions, dtype)

    def attend(self, qkv: torch.Tensor, n_heads: int, n_kv: int, head_dim: int, cache: KVCache, layer: int,
               rope) -> torch.Tensor:
        """qkv [B·T, (H + 2·KV)·D] → attention output [B·T, H·D]."""
        b, t = self.positions.shape
        qkv = qkv.view(b, t, n_heads + 2 * n_kv, head_dim)
        qk = rotate(qkv[:, :, : n_heads + n_kv], *rope)  # q and k heads in one pass
        q, k, v = qk[:, :, :n_heads], qk[:, :, n_heads:], qkv[:, :, n_heads + n_kv :]
        cache.write(layer, self.slots, self.positions, k, v)
        keys, values = cache.read(layer, self.read, self.span)  # [B, KV, S, D]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=self.mask,
                                             enable_gqa=n_heads != n_kv)
        return out.transpose(1, 2).reshape(b * t, -1)


PACKED_BLOCK = 16  # query tokens per attention block of a packed prefill


@dataclass
class TritonAttention:
    """Packed query tokens: per token its cache slot and position; per sequence its slot, first position, first
    token index and length; per query block (at most ``block_t`` tokens of one sequence) its sequence and offset."""

    tok_slot: torch.Tensor  # [N]
    tok_pos: torch.Tensor  # [N]
    seq_slot: torch.Tensor  # [R]
    seq_pos0: torch.Tensor
    seq_qstart: torch.Tensor
    seq_qlen: torch.Tensor
    blk_seq: torch.Tensor  # [NB]
    blk_q0: torch.Tensor
    block_t: int
    split: bool = False  # rows (decode steps) may split the keys into chunks; a packed prefill never does

    @classmethod
    def rows(cls, slots: torch.Tensor, positions: torch.Tensor) -> "TritonAttention":
        """B rows of T consecutive positions each (decode, verification, drafting): device ops only."""
        b, t = positions.shape
        dev = positions.device
        arange = torch.arange(b, device=dev)
        # The kernels index every table as a contiguous array.
        return cls(slots.view(b, 1).expand(b, t).contiguous().view(-1), positions.contiguous().view(-1),
                   slots.contiguous(), positions[:, 0].contiguous(), arange * t,
                   torch.full((b,), t, dtype=torch.long, device=dev), arange, torch.zeros(b, dtype=torch.long, device=dev),
                   max(1, 1 << (t - 1).bit_length()), split=True)

    @classmethod
    def packed(cls, slots: list[int], lengths: list[int], device, first: list[int] | None = None,
               block_t: int = PACKED_BLOCK) -> "TritonAttention":
        """Prompts back to back (prefill without padding): sequence i has ``lengths[i]`` tokens at positions
        ``first[i]``.. (default 0: a whole prompt; more: the rest of one whose prefix is cached) in slot
        ``slots[i]``."""
        first = first or [0] * len(slots)
        tok_slot, tok_pos, starts, blk_seq, blk_q0 = packed_tables(slots, lengths, first, block_t)
        as_t = lambda xs: upload(xs, torch.long, device)  # noqa: E731
        return cls(as_t(tok_slot), as_t(tok_pos), as_t(slots), as_t(first), as_t(starts), as_t(lengths),
                   as_t(blk_seq), as_t(blk_q0), block_t)

    def rope(self, rotary, dtype: torch.dtype):
        return rotary

    def attend(self, qkv: torch.Tensor, n_heads: int, n_kv: int, head_dim: int, cache: KVCache, layer: int,
               rope) -> torch.Tensor:
        qkv = qkv.reshape(-1, qkv.shape[-1])
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        q = kernels.rope_store(qkv, self.tok_pos, self.tok_slot, rope.cos, rope.sin, k_cache, v_cache, n_heads, n_kv,
                               head_dim)
        return kernels.cached_attention(q, k_cache, v_cache, self.seq_slot, self.seq_pos0, self.seq_qstart,
                                        self.seq_qlen, self.blk_seq, self.blk_q0, self.block_t, self.split)


def packed_tables(slots: list[int], lengths: list[int], first: list[int], block_t: int = PACKED_BLOCK):
    """The host-side tables of prompts packed back to back (``TritonAttention.packed``): each token's slot and
    position, each sequence's first token index, each query block's sequence and first offset."""
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    blocks = [(i, q0) for i, n in enumerate(lengths) for q0 in range(0, n, block_t)]
    tok_slot = [s for s, n in zip(slots, lengths) for _ in range(n)]
    tok_pos = [p for p0, n in zip(first, lengths) for p in range(p0, p0 + n)]
    return tok_slot, tok_pos, starts, [i for i, _ in blocks], [q0 for _, q0 in blocks]


def for_rows(fused: bool, slots: torch.Tensor, positions: torch.Tensor):
    """Metadata for B rows of T tokens: the kernels' when ``fused``, else the torch reference's."""
    return TritonAttention.rows(slots, positions) if fused else TorchAttention.build(slots, positions)
