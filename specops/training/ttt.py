"""EAGLE-3 training-time test: unroll the draft on its own outputs over whole sequences, as it runs when serving.

Alignment (vLLM's, and SpecForge's after its attention-mask fix): at step 0, draft position ``i`` reads the
embedding of token ``x[i+1]`` and the fused target features at ``i`` and predicts ``x[i+2]``, i.e. it is trained
against the target's distribution at position ``i+1``. At step ``k`` the same position reads ``x[i+1+k]`` and the
draft's own pre-norm hidden state from step ``k-1``, sits at rotary position ``i+k`` and predicts ``x[i+k+2]``.
Its attention sees the step-0 keys at positions ``<= i`` (the context a served draft holds in its KV cache,
written from target features) plus its own chain: the keys of steps ``1..k`` at the same index ``i``.

Loss: ``sum_k decay**k * CE_k`` where ``CE_k`` is the soft cross-entropy against the target's softmax over the
draft vocabulary, averaged over positions whose predicted token is an answer token and whose target argmax is in
the draft vocabulary (the only positions where an exact draft can be accepted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DECAY = 0.8


@dataclass
class Teacher:
    """The target's next-token distribution per position, restricted to the draft vocabulary."""

    probs: torch.Tensor  # [B, T, Vd] float32, softmax over the draft-vocabulary logits at position j
    in_vocab: torch.Tensor  # [B, T] bool: the full-vocabulary argmax at j is a draft token


@torch.no_grad()
def teacher(logits: torch.Tensor, t2d: torch.Tensor) -> Teacher:
    """From target logits [B, T, V] (recomputed from the stored final hidden states)."""
    logits = logits.float()
    return Teacher(torch.softmax(logits[..., t2d], dim=-1), t2d[logits.argmax(-1)])


def shift(x: torch.Tensor, k: int, fill=0) -> torch.Tensor:
    """``x[:, i + k]`` at index ``i`` along dim 1, ``fill`` past the end."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


def step_mask(lengths: torch.Tensor, prompt_lengths: torch.Tensor, width: int, k: int) -> torch.Tensor:
    """[B, T] positions trained at step ``k``: the predicted token ``x[i+k+2]`` exists and belongs to the answer."""
    idx = torch.arange(width, device=lengths.device).view(1, -1) + k + 2
    return (idx < lengths.view(-1, 1)) & (idx >= prompt_lengths.view(-1, 1))


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, KV, T, D] -> [B, KV·n_rep, T, D]: query head h reads key/value head h // n_rep."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def chain_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Attention of step ``len(keys) - 1``: causal over the step-0 keys, diagonal over the later steps' keys.

    q: [B, H, T, D]; keys/values: per step [B, H, T, D]. Returns [B, H, T, D].
    """
    t, d = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    s0 = (q @ keys[0].transpose(-1, -2)) * scale
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]
    w = torch.softmax(torch.cat([s0, *diag], dim=-1).float(), dim=-1).to(q.dtype)
    out = w[..., :t] @ values[0]
    for j, v in enumerate(values[1:]):
        out = out + w[..., t + j : t + j + 1] * v
    return out


def _layer_step(draft, emb, hidden, positions, keys, values):
    """The draft's decoder layer (as ``Eagle3Layer.forward``) with the chained training attention."""
    layer, c = draft.midlayer, draft.cfg
    attn = layer.self_attn
    b, t, _ = hidden.shape
    normed = layer.hidden_norm(hidden)
    residual = normed if layer.norm_before_residual else hidden
    x = torch.cat([layer.input_layernorm(emb), normed], dim=-1)
    q = draft.rotary(attn.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim), positions).transpose(1, 2)
    k = draft.rotary(attn.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim), positions).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
    rep = c.num_attention_heads // c.num_key_value_heads
    keys.append(_repeat_kv(k, rep))
    values.append(_repeat_kv(v, rep))
    out = chain_attention(q, keys, values).transpose(1, 2).reshape(b, t, -1)
    residual = residual + attn.o_proj(out)
    return residual + layer.mlp(layer.post_attention_layernorm(residual))


def unroll(draft, tokens: torch.Tensor, taps: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Per-step draft-vocabulary logits [B, T, Vd] for ``steps`` chained steps over whole sequences.

    tokens: [B, T] prompt + answer ids (right-padded); taps: [B, T, 3·H_target] target taps.
    """
    b, t = tokens.shape
    hidden = draft.combine(taps)
    base = torch.arange(t, device=tokens.device).expand(b, t)
    keys, values, logits = [], [], []
    for k in range(steps):
        emb = draft.embed(shift(tokens, k + 1)).to(hidden.dtype)
        hidden = _layer_step(draft, emb, hidden, base + k, keys, values)
        logits.append(draft.lm_head(draft.norm(hidden)))
    return logits


@dataclass
class StepResult:
    loss: torch.Tensor  # scalar, weighted sum over steps (what is optimised)
    step_losses: list[float]
    step_correct: list[int]  # draft argmax == target argmax at trained positions
    step_counts: list[int]  # trained positions per step


def soft_ce(logits: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over ``mask`` of ``-sum_v p_v log q_v`` (0 when nothing is masked in, so the step adds no gradient)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    per_pos = -(probs * logp).sum(-1)
    m = mask.float()
    return (per_pos * m).sum() / m.sum().clamp_min(1.0)


def ttt_loss(step_logits: list[torch.Tensor], teach: Teacher, lengths: torch.Tensor, prompt_lengths: torch.Tensor,
             decay: float = DECAY) -> StepResult:
    """Decayed sum of per-step soft cross-entropies and per-step accuracy counts."""
    t = step_logits[0].shape[1]
    total = step_logits[0].new_zeros((), dtype=torch.float32)
    losses, correct, counts = [], [], []
    for k, logits in enumerate(step_logits):
        probs = shift(teach.probs, k + 1)
        mask = step_mask(lengths, prompt_lengths, t, k) & shift(teach.in_vocab, k + 1, False)
        loss = soft_ce(logits, probs, mask)
        total = total + decay**k * loss
        losses.append(loss.item())
        with torch.no_grad():
            hit = (logits.argmax(-1) == probs.argmax(-1)) & mask
        correct.append(int(hit.sum()))
        counts.append(int(mask.sum()))
    return StepResult(total, losses, correct, counts)
