"""Training-time test maths: alignment with the serving forward, the chained attention, masks and the loss."""

from __future__ import annotations

import math

import pytest
import torch
from engine_helpers import draft_forward

from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaConfig, LlamaForCausalLM
from specops.training import ttt
from specops.training.data import forward_features


def tiny_target(seed: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    })
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg, 128).eval()


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    target = tiny_target()
    draft = Eagle3Draft.random(target.config, token_ids=list(range(0, 97, 2)), seed=1).attach(target)
    with torch.no_grad():  # larger weights than the 0.02 init, so positions and steps visibly differ
        for name, p in draft.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(20)
    tokens = torch.randint(0, 97, (2, 14))
    feats = forward_features(target, tokens.tolist(), draft.tap_layers, "cpu")
    taps = torch.stack([f.taps for f in feats])
    return target, draft, tokens, taps


def test_unroll_matches_the_serving_chain(setup):
    """Step k at index n equals what the draft computes when serving: prefill 0..n, then k chained steps."""
    _, draft, tokens, taps = setup
    steps = 3
    with torch.no_grad():
        logits = ttt.unroll(draft, tokens, taps, steps)
    draft_ids = torch.arange(draft.draft_vocab_size) + draft.d2t
    t = tokens.shape[1]
    for n in (0, 4, t - steps - 1):
        cache, slots = draft.new_cache(2, 32), torch.arange(2)
        with torch.no_grad():
            served, pre = draft_forward(draft, tokens[:, 1 : n + 2], draft.combine(taps[:, : n + 1]),
                                        torch.arange(n + 1).expand(2, -1), cache, slots)
            torch.testing.assert_close(served[:, -1, draft_ids], logits[0][:, n], atol=1e-4, rtol=1e-4)
            hidden = pre[:, -1:]
            for k in range(1, steps):
                served, hidden = draft_forward(draft, tokens[:, n + 1 + k : n + 2 + k], hidden, torch.full((2, 1), n + k),
                                               cache, slots)
                torch.testing.assert_close(served[:, -1, draft_ids], logits[k][:, n], atol=1e-4, rtol=1e-4)
    assert (logits[1] - logits[0]).abs().max() > 1e-2  # the chain steps are not a copy of step 0


def test_chain_attention_against_explicit_key_lists():
    torch.manual_seed(0)
    b, h, t, d, steps = 2, 3, 6, 4, 3
    q = torch.randn(b, h, t, d)
    keys = [torch.randn(b, h, t, d) for _ in range(steps)]
    values = [torch.randn(b, h, t, d) for _ in range(steps)]
    out = ttt.chain_attention(q, keys, values)
    for i in range(t):
        ks = torch.cat([keys[0][:, :, : i + 1]] + [k[:, :, i : i + 1] for k in keys[1:]], dim=2)
        vs = torch.cat([values[0][:, :, : i + 1]] + [v[:, :, i : i + 1] for v in values[1:]], dim=2)
        w = torch.softmax(q[:, :, i : i + 1] @ ks.transpose(-1, -2) / math.sqrt(d), dim=-1)
        torch.testing.assert_close(out[:, :, i : i + 1], w @ vs)


def test_step_mask_marks_predicted_answer_tokens():
    # one row: 4 prompt tokens + 3 answer tokens (length 7); step k at index i predicts x[i+k+2]
    mask = ttt.step_mask(torch.tensor([7]), torch.tensor([4]), 8, 0)
    assert mask[0].tolist() == [False, False, True, True, True, False, False, False]
    mask = ttt.step_mask(torch.tensor([7]), torch.tensor([4]), 8, 2)
    assert mask[0].tolist() == [True, True, True, False, False, False, False, False]


def test_loss_is_decayed_soft_cross_entropy_on_masked_positions():
    torch.manual_seed(0)
    b, t, vd, v = 2, 9, 5, 11
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[[0, 2, 3, 7, 10]] = True
    target_logits = torch.randn(b, t, v)
    teach = ttt.teacher(target_logits, t2d)
    step_logits = [torch.randn(b, t, vd, requires_grad=True) for _ in range(3)]
    lengths, prompt_lengths = torch.tensor([9, 7]), torch.tensor([3, 2])
    result = ttt.ttt_loss(step_logits, teach, lengths, prompt_lengths)
    expected = 0.0
    for k, logits in enumerate(step_logits):
        terms = []
        for r in range(b):
            for i in range(t):
                j = i + k + 1  # the target position whose distribution step k at i is trained against
                if not (prompt_lengths[r] <= j + 1 < lengths[r]) or not t2d[target_logits[r, j].argmax()]:
                    continue
                p = torch.softmax(target_logits[r, j, t2d], -1)
                terms.append(-(p * torch.log_softmax(logits[r, i], -1)).sum())
        step = torch.stack(terms).mean()
        assert result.step_losses[k] == pytest.approx(step.item(), rel=1e-5)
        assert result.step_counts[k] == len(terms)
        expected = expected + 0.8**k * step
    assert result.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    result.loss.backward()
    unmasked = ~ttt.step_mask(lengths, prompt_lengths, t, 0)
    assert step_logits[0].grad[unmasked].abs().max() == 0


def test_accuracy_counts_the_shifted_teacher():
    """A draft that outputs the target's argmax one position ahead is right everywhere; the unshifted one is not."""
    t, v = 10, 6
    t2d = torch.ones(v, dtype=torch.bool)
    target_logits = torch.nn.functional.one_hot(torch.arange(t) % v, v).float().unsqueeze(0) * 10
    teach = ttt.teacher(target_logits, t2d)
    lengths, prompt_lengths = torch.tensor([t]), torch.tensor([1])
    for k in range(3):
        ahead = [ttt.shift(target_logits, k + 1)] * (k + 1)
        same = [target_logits] * (k + 1)
        right = ttt.ttt_loss(ahead, teach, lengths, prompt_lengths)
        wrong = ttt.ttt_loss(same, teach, lengths, prompt_lengths)
        assert right.step_correct[k] == right.step_counts[k] > 0
        assert wrong.step_correct[k] == 0
