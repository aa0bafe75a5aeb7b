"""Static KV cache: one preallocated tensor pair, indexed by (layer, slot, head, position).

Shapes never change after allocation, so a step that writes and reads it can be captured as a CUDA graph.
A slot's valid length lives with the scheduler; attention only looks at positions <= the query's, so
"rollback" after rejected draft tokens is just using a smaller length: stale entries get overwritten first.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int, dtype, device):
        shape = (layers, slots, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v: [B, T, kv_heads, head_dim] stored at (slots[b], positions[b, t])."""
        rows = slots.view(-1, 1).expand_as(positions)
        self.k[layer, rows, :, positions] = k.to(self.k.dtype)
        self.v[layer, rows, :, positions] = v.to(self.v.dtype)

    def read(self, layer: int, slots: torch.Tensor | slice, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions [0, span) for each slot: [B, kv_heads, span, head_dim].

        A slice of consecutive slots returns views; a tensor of slots gathers copies.
        """
        return self.k[layer, slots, :, :span], self.v[layer, slots, :, :span]

    def copy(self, src: int, dst: int, length: int) -> None:
        """Positions [0, length) of slot ``src`` into slot ``dst``, every layer (a cached prefix, in or out)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
