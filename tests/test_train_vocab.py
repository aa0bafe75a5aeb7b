"""Draft vocabulary: the most frequent answer tokens, and d2t/t2d that agree with each other and with vLLM's rule."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specops.training import vocab


def test_most_frequent_tokens_ties_to_smaller_id():
    seqs = [[5, 5, 5, 9, 9, 2], [9, 7, 7, 1]]
    chosen, d2t, t2d = vocab.build(seqs, vocab_size=12, size=3)
    # counts: 5→3, 9→3, 7→2, 2→1, 1→1
    assert chosen.tolist() == [5, 7, 9]
    assert (torch.arange(3) + d2t).tolist() == [5, 7, 9]
    assert t2d.nonzero().flatten().tolist() == [5, 7, 9]


def test_unseen_tokens_fill_a_vocabulary_larger_than_the_data():
    chosen, _, t2d = vocab.build([[4, 4, 8]], vocab_size=10, size=5)
    assert chosen.tolist() == [0, 1, 2, 4, 8]
    assert int(t2d.sum()) == 5


def test_size_is_capped_at_the_target_vocabulary():
    chosen, d2t, t2d = vocab.build([[1, 2]], vocab_size=4, size=100)
    assert chosen.tolist() == [0, 1, 2, 3] and d2t.tolist() == [0, 0, 0, 0] and bool(t2d.all())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 49), max_size=30), max_size=8), st.integers(1, 50))
def test_mapping_is_consistent(seqs, size):
    chosen, d2t, t2d = vocab.build(seqs, vocab_size=50, size=size)
    target_ids = torch.arange(chosen.numel()) + d2t
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert target_ids.tolist() == chosen.tolist() == sorted(set(chosen.tolist()))
    assert int(t2d.sum()) == chosen.numel() == size
    assert bool(t2d[target_ids].all())
    assert (d2t >= 0).all()  # ascending ids: offsets never negative
    counts = vocab.token_counts(seqs, 50)
    left_out = ~t2d
    if left_out.any():  # nothing left out is more frequent than anything kept
        assert counts[left_out].max() <= counts[t2d].min()
