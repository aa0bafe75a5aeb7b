"""Drafters behind one interface: given the tokens the target just verified, propose the next tokens per row.

``Proposer`` is what the model runner calls. ``Eagle3Proposer`` runs an EAGLE-3 draft; ``SchemaProposer`` needs
no model (it proposes the grammar's forced tokens alone).

EAGLE-3: one round = one pass over the tokens the target just verified (their taps, fused by ``fc``, paired with
the token that followed each) plus single-token steps that feed the draft's own pre-norm output back, with the
draft's own one-layer KV cache. Rows read their first proposal at their own index ``pick`` (the last accepted
position); entries the pass wrote beyond it sit at positions later steps overwrite first, as in vLLM's padded
drafting. Without grammar guides every step is device work only, so the whole chain is captured with the round.

Schema-aware drafting (``forced`` > 0, rows under a grammar): where the schema forces the next tokens
(``Cursor.forced``) they are the proposals, whatever the draft says, and they do not use up the row's γ free
positions; so a row drafts up to γ free tokens plus the forced runs around them, at most γ + ``forced`` tokens,
and one verification covers them all. The draft model steps through a forced token only when a free proposal
may follow it (its cache and hidden state must follow the chain), and never more than the γ − 1 steps of plain
drafting: forced tokens ride along without making the draft run longer. (Letting the draft step through every
forced run raised tokens per target forward further but cost more in draft steps than it saved.) A forced token
is drawn from a one-hot distribution, a valid draft distribution like any other, so verification stays exact
whether or not the target agrees with it.
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
    u: torch.Tensor | None  # [B, ≥ steps] uniforms; None when every row is greedy (drafts are argmaxes)
    gamma: int  # free proposals per row this round (≤ the proposer's γ; 0: none, and no draft steps)
    filtering: bool = False  # some row cuts with top-k / top-p
    guides: list | None = None  # per row None or a grammar cursor context (``Constraint.drafting``)
    prefill: bool = False  # the target's forward was a prefill: the draft reads the prompt even at γ = 0


class Proposer(Protocol):
    gamma: int

    def propose(self, inp: DraftInput, meta_for: Callable[[torch.Tensor, torch.Tensor], object]
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Draft tokens [B, K], the distributions they were drawn from [B, K, V] (None when all greedy) and each
        row's number of drafts [B] (None when every row drafts K = γ). ``meta_for(slots, positions [B, T])``
        builds attention metadata for the drafter's own steps."""


def _one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.zeros(*tokens.shape, vocab, device=tokens.device).scatter_(-1, tokens.unsqueeze(-1), 1.0)


class Eagle3Proposer:
    def __init__(self, draft: Eagle3Draft, gamma: int, slots: int, max_len: int, forced: int = 0):
        self.draft = draft
        self.gamma, self.forced = gamma, forced
        self.cache = draft.new_cache(slots, max_len)

    @torch.inference_mode()
    def propose(self, inp: DraftInput, meta_for):
        # At γ = 0 (``--gamma auto`` under load) a decode round runs no draft at all: the draft's cache then lacks
        # those positions, which only lowers acceptance once γ rises again. A prompt is always read, so that a
        # request admitted under load still drafts with its prompt in context later.
        if inp.gamma == 0 and inp.guides is None and not inp.prefill:
            return inp.tokens[:, :0], None, None
        full = inp.u is not None or inp.guides is not None  # else argmaxes over the draft vocabulary are enough
        hidden = self.draft.combine(inp.taps).reshape(-1, self.draft.cfg.hidden_size)
        logits, hidden = self.draft(inp.tokens, hidden, self.cache, inp.meta, full, at=inp.pick)
        if inp.gamma == 0 and inp.guides is None:
            return inp.tokens[:, :0], None, None
        if inp.guides is None:
            return self._chain(inp, logits, hidden, full, meta_for)
        return self._guided(inp, logits, hidden, meta_for)

    def _pick(self, inp: DraftInput, logits: torch.Tensor, k: int, full: bool):
        """Step k's proposals and the distributions they come from (None when every row is greedy)."""
        if not full:
            return self.draft.to_target(logits.argmax(dim=-1)), None
        if inp.u is None:
            return logits.argmax(dim=-1), None
        q = logits_to_probs(logits, inp.temperature, inp.top_k, inp.top_p, inp.filtering)
        return sample_from(q, inp.u[:, k]), q  # greedy rows: q is one-hot at the argmax

    def _chain(self, inp, logits, hidden, full, meta_for):
        """γ proposals per row, device work only."""
        pos, tokens, probs = inp.positions, [], []
        for k in range(inp.gamma):
            d, q = self._pick(inp, logits, k, full)
            tokens.append(d)
            if q is not None:
                probs.append(q)
            if k + 1 < inp.gamma:
                pos = pos + 1
                logits, hidden = self.draft(d.unsqueeze(1), hidden, self.cache, meta_for(inp.slots, pos.unsqueeze(1)),
                                            full)
        return torch.stack(tokens, dim=1), (torch.stack(probs, dim=1) if probs else None), None

    def _guided(self, inp, logits, hidden, meta_for):
        """Proposals masked by each row's grammar, forced runs taken as they are (see the module docstring)."""
        b, gamma = inp.positions.shape[0], inp.gamma
        budget = max(gamma - 1, 0)  # chain steps per round: forced tokens never make the draft run longer
        pos, tokens, probs, d = inp.positions, [], [], None
        lengths, free = [0] * b, [0] * b
        queues: list[list[int]] = [[] for _ in range(b)]
        with ExitStack() as stack:
            cursors = [stack.enter_context(g) if g is not None else None for g in inp.guides]
            active, stepping, steps = list(range(b)), True, 0
            for k in range(gamma + self.forced):
                forced = {}
                for i in active:  # host work first: does any row draft at this step?
                    cur = cursors[i]
                    if cur is not None and lengths[i] - free[i] < self.forced:
                        queues[i] = queues[i] or cur.forced()
                        if queues[i]:
                            forced[i] = queues[i].pop(0)
                if k and stepping:  # the draft reads the last proposal (forced or not) to propose the next
                    stepping = steps < budget and any(  # some row proposes now, or can within the budget
                        i not in forced or (free[i] < gamma and steps + len(queues[i]) < budget)
                        for i in active)
                active = [i for i in active if i in forced or (free[i] < gamma and (k == 0 or stepping))]
                if not active:
                    break
                if k and stepping:
                    pos, steps = pos + 1, steps + 1
                    logits, hidden = self.draft(d.unsqueeze(1), hidden, self.cache,
                                                meta_for(inp.slots, pos.unsqueeze(1)), True)
                for i in active:
                    if cursors[i] is not None and i not in forced:
                        mask_logits_(logits[i], cursors[i].mask(), keep_unsatisfiable=True)
                d, q = self._pick(inp, logits, k, True)
                if forced:
                    rows = torch.tensor(list(forced), device=d.device)
                    d = d.index_put((rows,), torch.tensor(list(forced.values()), device=d.device))
                    if q is not None:
                        q = q.index_put((rows,), _one_hot(d[rows], q.shape[-1]))
                chosen = d.tolist()
                for i in active:
                    lengths[i] += 1
                    free[i] += i not in forced
                    if cursors[i] is not None:
                        cursors[i].advance(chosen[i])
                tokens.append(d)
                if q is not None:
                    probs.append(q)
        dev = inp.positions.device
        if not tokens:  # γ = 0 and nothing forced
            return inp.tokens[:, :0], None, torch.zeros(b, dtype=torch.long, device=dev)
        return (torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None,
                torch.tensor(lengths, device=dev))


class SchemaProposer:
    """Drafts the grammar's forced tokens and nothing else: no model and no free positions (rows without a grammar
    draft nothing, so batches without one decode plainly)."""

    gamma = 0

    def __init__(self, forced: int, vocab_size: int):
        self.forced, self.vocab_size = forced, vocab_size

    def propose(self, inp: DraftInput, meta_for):
        b, dev = inp.positions.shape[0], inp.positions.device
        if inp.guides is None:
            return inp.tokens[:, :0], None, None
        rows: list[list[int]] = [[] for _ in range(b)]
        with ExitStack() as stack:
            for i, g in enumerate(inp.guides):
                if g is None:
                    continue
                cur = stack.enter_context(g)
                while len(rows[i]) < self.forced and (run := cur.forced()):
                    for t in run[: self.forced - len(rows[i])]:
                        cur.advance(t)
                        rows[i].append(t)
        width = max(map(len, rows))
        drafts = torch.zeros(b, width, dtype=torch.long, device=dev)
        for i, r in enumerate(rows):
            drafts[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        probs = _one_hot(drafts, self.vocab_size) if inp.u is not None else None
        return drafts, probs, torch.tensor([len(r) for r in rows], device=dev)
