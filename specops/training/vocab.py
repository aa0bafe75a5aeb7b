"""The draft vocabulary: the target tokens the draft can propose, chosen by how often the target emits them.

A draft head over the full target vocabulary wastes most of its rows on tokens the domain never uses; EAGLE-3
keeps the most frequent tokens of the regenerated answers. The mapping follows vLLM's checkpoint convention:
draft ids are the chosen target ids in ascending order, ``d2t[d]`` is the offset with
``target_id = d + d2t[d]`` and ``t2d`` is a boolean mask over the target vocabulary.
"""

from __future__ import annotations

from typing import Iterable

import torch


def token_counts(sequences: Iterable[list[int]], vocab_size: int) -> torch.Tensor:
    """How often each target id occurs in ``sequences`` (int64, length ``vocab_size``)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in sequences:
        if seq:
            counts += torch.bincount(torch.tensor(seq, dtype=torch.int64), minlength=vocab_size)
    return counts


def select_tokens(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids, ties broken by the smaller id (so the choice is deterministic), ascending."""
    size = min(size, counts.numel())
    order = torch.sort(-counts, stable=True).indices  # stable over ids in ascending order: ties keep the smaller id
    return torch.sort(order[:size]).values


def mapping(chosen: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` for the ascending target ids ``chosen``."""
    d2t = chosen - torch.arange(chosen.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return d2t.to(torch.int64), t2d


def build(sequences: Iterable[list[int]], vocab_size: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(draft_to_target_ids, d2t, t2d)`` for a draft vocabulary of ``size`` tokens drawn from ``sequences``."""
    chosen = select_tokens(token_counts(sequences, vocab_size), size)
    d2t, t2d = mapping(chosen, vocab_size)
    return chosen, d2t, t2d
