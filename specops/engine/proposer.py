"""Drafters behind one interface: given the tokens the target just verified, propose the next γ tokens per row.

``Proposer`` is what the model runner calls; EAGLE-3 chain drafting is the one implementation here, and a drafter
that needs no model (grammar-forced tokens) or a different model plugs in by implementing ``propose``.

EAGLE-3: one round = one pass over the tokens the target just verified (their taps, fused by ``fc``, paired with
the token that followed each) plus γ − 1 single-token steps that feed the draft's own pre-norm output back, with
the draft's own one-layer KV cache. Rows read their first proposal at their own index ``pick`` (the last accepted
position); entries the pass wrote beyond it sit at positions later steps overwrite first, as in vLLM's padded
drafting. Without grammar guides every step is device work only, so the whole chain is captured with the round.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from specops.engine.sampling import logits_to_probs, mask_logits_, sample_from
from specops.models.eagle3 import Eagle3Draft


@dataclass
class DraftInput:
    """What the target's last forward leaves for the drafter (N = the B·T tokens of that forward)."""

    tokens: torch.Tensor  # [B, T] the token after each verified position (the target's "shifted" input)
    taps: torch.Tensor  # [B, T, 3·H] the target's taps at those positions
    meta: object  # the attention metadata of that forward (same slots and positions)
    pick: torch.Tensor  # [B] index into the N tokens of each row's last accepted position
    positions: torch.Tensor  # [B] the position at ``pick``
    slots: torch.Tensor  # [B] cache slots
    temperature: torch.Tensor  # [B]
    top_k: torch.Tensor
    top_p: torch.Tensor
    u: torch.Tensor | None  # [B, γ] uniforms; None when every row is greedy (drafts are argmaxes)
    filtering: bool = False  # some row cuts with top-k / top-p
    guides: list | None = None  # per row None or a grammar cursor context (``Constraint.drafting``)


class Proposer(Protocol):
    gamma: int

    def propose(self, inp: DraftInput, meta_for: Callable[[torch.Tensor, torch.Tensor], object]
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [B, γ] and the distributions they were drawn from [B, γ, V] (None when all greedy).
        ``meta_for(slots, positions [B, T])`` builds attention metadata for the drafter's own steps."""


class Eagle3Proposer:
    def __init__(self, draft: Eagle3Draft, gamma: int, slots: int, max_len: int):
        self.draft = draft
        self.gamma = gamma
        self.cache = draft.new_cache(slots, max_len)

    @torch.inference_mode()
    def propose(self, inp: DraftInput, meta_for) -> tuple[torch.Tensor, torch.Tensor | None]:
        u, guides = inp.u, inp.guides
        full = u is not None or guides is not None  # else argmaxes over the draft vocabulary are enough
        hidden = self.draft.combine(inp.taps).reshape(-1, self.draft.cfg.hidden_size)
        logits, hidden = self.draft(inp.tokens, hidden, self.cache, inp.meta, full, at=inp.pick)
        pos = inp.positions
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
                    q = logits_to_probs(logits, inp.temperature, inp.top_k, inp.top_p, inp.filtering)
                    d = sample_from(q, u[:, k])  # greedy rows: q is one-hot at the argmax
                    out_probs.append(q)
                for i, cur in enumerate(cursors):
                    if cur is not None:
                        cur.advance(int(d[i]))
                out_tokens.append(d)
                if k + 1 < self.gamma:
                    pos = pos + 1
                    step = d.unsqueeze(1)
                    logits, hidden = self.draft(step, hidden, self.cache, meta_for(inp.slots, pos.unsqueeze(1)), full)
        return torch.stack(out_tokens, dim=1), (torch.stack(out_probs, dim=1) if out_probs else None)
