"""EAGLE-3 chain drafting: γ tokens per request, batched, with the draft's own one-layer KV cache.

One round = one pass over the tokens the target just verified (their taps, fused by ``fc``, paired with the
token that followed each) plus γ − 1 single-token steps that feed the draft's own pre-norm output back.
Rows read their first proposal at their own index ``pick`` (the last accepted position); entries the pass wrote
beyond it sit at positions later steps overwrite first, as in vLLM's padded drafting.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from specops.engine.sampling import logits_to_probs, mask_logits_, sample_from
from specops.models.eagle3 import Eagle3Draft


class Eagle3Proposer:
    def __init__(self, draft: Eagle3Draft, gamma: int, slots: int, max_len: int):
        self.draft = draft
        self.gamma = gamma
        self.cache = draft.new_cache(slots, max_len)

    @torch.inference_mode()
    def propose(
        self,
        tokens: torch.Tensor,
        taps: torch.Tensor,
        positions: torch.Tensor,
        pick: torch.Tensor,
        slots: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        u: torch.Tensor | None,
        guides: list | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens, positions: [B, T] (tokens already shifted: the token after each position); taps: [B, T, 3·H];
        pick: [B] index of each row's last valid position; u: [B, γ] uniforms, or None when every row is greedy
        (then drafts are argmaxes and no distributions are returned); guides: per row None or a grammar
        cursor context (``Constraint.drafting``) whose masks restrict that row's proposals.
        Returns draft tokens [B, γ] and the distributions they were sampled from [B, γ, V] (or None)."""
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        full = u is not None or guides is not None  # else argmaxes over the draft vocabulary are enough
        logits, hidden = self.draft(tokens, self.draft.combine(taps), positions, self.cache, slots, full, at=pick)
        logits, pos = logits[:, 0], positions[rows, pick]
        out_tokens, out_probs = [], []
        with ExitStack() as stack:
            cursors = [stack.enter_context(g) if g is not None else None for g in guides or []]
            for k in range(self.gamma):
                for i, cur in enumerate(cursors):
                    if cur is not None:
                        mask_logits_(logits[i], cur.mask(), keep_unsatisfiable=True)
                if not full:
                    d = self.draft.to_target(logits.argmax(dim=-1))
                elif u is None:
                    d = logits.argmax(dim=-1)
                else:
                    q = logits_to_probs(logits, temperature, top_k, top_p)
                    d = sample_from(q, u[:, k])  # greedy rows: q is one-hot at the argmax
                    out_probs.append(q)
                for i, cur in enumerate(cursors):
                    if cur is not None:
                        cur.advance(int(d[i]))
                out_tokens.append(d)
                if k + 1 < self.gamma:
                    pos = pos + 1
                    logits, hidden = self.draft(d.unsqueeze(1), hidden, pos.unsqueeze(1), self.cache, slots, full)
                    logits = logits[:, 0]
        return torch.stack(out_tokens, dim=1), (torch.stack(out_probs, dim=1) if out_probs else None)

