"""Speculative verification (rejection sampling), vectorised over batch × γ.

Greedy rows: accept the longest prefix where draft == target argmax, then one bonus token (the target's argmax at
the first mismatch, or after the last draft). Sampling rows (Leviathan et al. 2023): accept draft token x with
probability min(1, p(x)/q(x)); at the first rejection sample from norm(max(0, p − q)); if all γ are accepted,
sample a bonus token from p. The emitted tokens are distributed exactly as sampling from p token by token.
"""

from __future__ import annotations

import torch

from specops.engine.sampling import sample_from


def acceptance_probs(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) for each drafted x. p, q: [..., V]; tokens: [...]. q(x) = 0 (never drafted) gives 0."""
    px = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    qx = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(qx > 0, (px / qx.clamp_min(torch.finfo(qx.dtype).tiny)).clamp(max=1.0), torch.zeros_like(px))


def residual_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)); where p ≤ q everywhere (a rejection is then impossible) it falls back to p.

    A residual mass below the dtype's smallest normal number is a rejection chance of nothing and cannot be
    normalised accurately, so it takes the same fallback.
    """
    r = (p - q).clamp_min(0)
    mass = r.sum(-1, keepdim=True)
    tiny = torch.finfo(r.dtype).tiny
    return torch.where(mass >= tiny, r / mass.clamp_min(tiny), p)


def verify(
    target_logits: torch.Tensor,
    target_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    greedy: torch.Tensor,
    u_accept: torch.Tensor | None,
    u_sample: torch.Tensor | None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decide how many drafts each row keeps and the token that follows them.

    target_logits, target_probs: [B, γ+1, V] at the γ+1 verified positions; draft_tokens: [B, γ];
    draft_probs: [B, γ, V], the distribution each draft token was sampled from (one-hot for a greedy draft);
    greedy: [B] bool; u_accept: [B, γ], u_sample: [B] uniforms in [0, 1). A batch of greedy rows only needs none
    of the distributions or uniforms: pass None for them. ``lengths`` [B]: each row's number of drafts when rows
    draft different numbers (γ is then the widest); drafts past a row's length are never accepted and its bonus
    token comes from the position after its last draft.

    Returns (num_accepted [B], tokens [B, γ+1]): tokens[b, :n+1] are the emitted tokens (n accepted drafts, then
    the bonus/recovered token); tokens[b, n+1:] keep the rejected drafts so the row is a valid shifted input
    for the draft model's next pass.
    """
    b, g = draft_tokens.shape
    argmax = target_logits.argmax(dim=-1)  # [B, γ+1]
    valid = None if lengths is None else torch.arange(g, device=draft_tokens.device) < lengths.view(b, 1)
    if target_probs is None:
        ok = draft_tokens == argmax[:, :g]
        n = (ok if valid is None else ok & valid).long().cumprod(dim=-1).sum(dim=-1)
        tokens = torch.cat([draft_tokens, draft_tokens.new_zeros(b, 1)], dim=1)
        return n, tokens.scatter_(1, n.view(b, 1), argmax.gather(1, n.view(b, 1)))
    if g:
        greedy_ok = draft_tokens == argmax[:, :g]
        sample_ok = u_accept < acceptance_probs(target_probs[:, :g], draft_probs, draft_tokens)
        ok = torch.where(greedy.view(b, 1), greedy_ok, sample_ok)
        if valid is not None:
            ok = ok & valid
        n = ok.long().cumprod(dim=-1).sum(dim=-1)
    else:
        n = torch.zeros(b, dtype=torch.long, device=draft_tokens.device)
    idx = n.view(b, 1, 1).expand(b, 1, target_probs.shape[-1])
    p_n = target_probs.gather(1, idx).squeeze(1)
    q_pad = torch.cat([draft_probs, torch.zeros_like(p_n).unsqueeze(1)], dim=1)  # q = 0 after the last draft
    q_n = q_pad.gather(1, idx).squeeze(1)
    if lengths is not None:  # ... and after a row's own last draft (n reached its length)
        q_n = q_n * (n < lengths).unsqueeze(1)
    sampled = sample_from(residual_probs(p_n, q_n), u_sample)
    nxt = torch.where(greedy, argmax.gather(1, n.view(b, 1)).squeeze(1), sampled)
    tokens = torch.cat([draft_tokens, draft_tokens.new_zeros(b, 1)], dim=1)
    tokens.scatter_(1, n.view(b, 1), nxt.view(b, 1))
    return n, tokens
