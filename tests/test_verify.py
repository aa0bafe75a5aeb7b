"""Rejection-sampling maths: hand-computed cases and properties over random inputs."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specops.engine.sampling import sample_from
from specops.engine.verify import acceptance_probs, residual_probs, verify


def onehot(ids, v):
    return torch.nn.functional.one_hot(torch.tensor(ids), v).float()


def test_greedy_accepts_longest_matching_prefix_plus_bonus():
    v = 5
    # target argmax at the 4 verified positions: 1, 2, 3, 4
    logits = onehot([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]], v) * 3.0
    drafts = torch.tensor([[1, 2, 0], [1, 2, 3], [0, 2, 3]])  # mismatch at 2; full match; mismatch at 0
    q = onehot(drafts.tolist(), v)
    n, out = verify(logits, logits.softmax(-1), drafts, q, torch.tensor([True] * 3), torch.zeros(3, 3), torch.zeros(3))
    assert n.tolist() == [2, 3, 0]
    assert out[0, :3].tolist() == [1, 2, 3]  # two accepted, then the target's token at the mismatch
    assert out[1].tolist() == [1, 2, 3, 4]  # all accepted, bonus from the last position
    assert out[2, 0].item() == 1
    assert out[0, 3].item() == 0 and out[2, 1:3].tolist() == [2, 3]  # tail keeps the (rejected) drafts


def test_sampling_hand_computed_acceptance_and_residual():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    # draft token 1: accept with p/q = 0.5; residual max(0, p - q) = [0.3, 0, 0] → always token 0
    assert torch.allclose(acceptance_probs(p, q, torch.tensor(1)), torch.tensor(0.5))
    assert torch.allclose(residual_probs(p, q), torch.tensor([1.0, 0.0, 0.0]))
    # draft token 0: p/q = 2.5 → accept with probability 1
    assert acceptance_probs(p, q, torch.tensor(0)).item() == 1.0
    logits = torch.zeros(1, 2, 3)
    probs = torch.stack([p, torch.tensor([0.1, 0.1, 0.8])]).unsqueeze(0)
    drafts, qs = torch.tensor([[1]]), q.view(1, 1, 3)
    greedy = torch.tensor([False])
    n, out = verify(logits, probs, drafts, qs, greedy, torch.tensor([[0.49]]), torch.tensor([0.99]))
    assert n.item() == 1 and out[0].tolist() == [1, 2]  # accepted (0.49 < 0.5), bonus from p[1] at u=0.99 → 2
    n, out = verify(logits, probs, drafts, qs, greedy, torch.tensor([[0.51]]), torch.tensor([0.99]))
    assert n.item() == 0 and out[0, 0].item() == 0  # rejected, residual puts all mass on token 0


def test_gamma_zero_is_plain_sampling():
    probs = torch.tensor([[[0.25, 0.25, 0.5]]])
    n, out = verify(probs.log(), probs, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, 3),
                    torch.tensor([False]), torch.zeros(1, 0), torch.tensor([0.6]))
    assert n.item() == 0 and out.tolist() == [[2]]


def test_inverse_cdf_sampling_skips_zero_mass_tokens():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    assert [sample_from(probs, torch.tensor(u)).item() for u in (0.0, 0.49, 0.5, 0.9999999)] == [1, 1, 3, 3]


dists = st.integers(min_value=2, max_value=8).flatmap(
    lambda v: st.tuples(
        st.lists(st.floats(0, 1), min_size=v, max_size=v).filter(lambda x: sum(x) > 1e-3),
        st.lists(st.floats(0, 1), min_size=v, max_size=v).filter(lambda x: sum(x) > 1e-3),
    )
)


@settings(max_examples=200, deadline=None)
@given(dists)
def test_residual_is_a_distribution_and_acceptance_in_unit_interval(pq):
    p, q = (torch.tensor(x, dtype=torch.float64) for x in pq)
    p, q = p / p.sum(), q / q.sum()
    r = residual_probs(p, q)
    assert torch.all(r >= 0) and abs(r.sum().item() - 1) < 1e-9
    a = acceptance_probs(p.expand(len(p), -1), q.expand(len(p), -1), torch.arange(len(p)))
    assert torch.all((a >= 0) & (a <= 1))
    # The two together reproduce p exactly: P(x) = q(x)·a(x) + (1 − Σ q·a)·r(x).
    accept_mass = (q * a).sum()
    assert torch.allclose(q * a + (1 - accept_mass) * r, p, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(2, 9), st.integers(0, 2**31 - 1))
def test_greedy_path_equals_argmax_prefix(gamma, v, seed):
    g = torch.Generator().manual_seed(seed)
    b = 4
    logits = torch.randn(b, gamma + 1, v, generator=g)
    argmax = logits.argmax(-1)
    # drafts that agree with the argmax with probability 1/2 per position
    drafts = torch.where(torch.rand(b, gamma, generator=g) < 0.5, argmax[:, :gamma],
                         torch.randint(0, v, (b, gamma), generator=g))
    q = torch.nn.functional.one_hot(drafts, v).float()
    n, out = verify(logits, logits.softmax(-1), drafts, q, torch.ones(b, dtype=torch.bool),
                    torch.rand(b, gamma, generator=g), torch.rand(b, generator=g))
    for i in range(b):
        k = 0
        while k < gamma and drafts[i, k] == argmax[i, k]:
            k += 1
        assert n[i].item() == k
        assert out[i, : k + 1].tolist() == argmax[i, : k + 1].tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.integers(2, 9), st.integers(0, 2**31 - 1))
def test_rows_of_different_lengths_verify_as_if_alone(gamma, v, seed):
    """A batch whose rows hold different numbers of drafts (γ switched between rounds) gives each row what verifying
    it alone, with only its own drafts, gives: the padding past a row's length (stale drafts and distributions) is
    never accepted and never shapes its residual."""
    g = torch.Generator().manual_seed(seed)
    b = 5
    lengths = torch.randint(0, gamma + 1, (b,), generator=g)
    probs = torch.rand(b, gamma + 1, v, generator=g).softmax(-1)
    q = torch.rand(b, gamma, v, generator=g).softmax(-1)
    drafts = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, gamma)
    greedy = torch.rand(b, generator=g) < 0.3
    u_accept, u_sample = torch.rand(b, gamma, generator=g), torch.rand(b, generator=g)
    for sampled in (True, False):
        n, out = verify(probs.log(), probs if sampled else None, drafts, q if sampled else None,
                        greedy if sampled else torch.ones(b, dtype=torch.bool), u_accept, u_sample, lengths)
        for i in range(b):
            k = lengths[i].item()
            row = [x[i : i + 1] for x in (probs[:, : k + 1], drafts[:, :k], q[:, :k])]
            n1, out1 = verify(row[0].log(), row[0] if sampled else None, row[1], row[2] if sampled else None,
                              greedy[i : i + 1] if sampled else torch.ones(1, dtype=torch.bool),
                              u_accept[i : i + 1, :k], u_sample[i : i + 1])
            assert n[i].item() == n1.item() <= k
            assert out[i, : n1.item() + 1].tolist() == out1[0, : n1.item() + 1].tolist()
