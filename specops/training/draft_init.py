"""The draft a training run starts from: fresh, or an existing draft carried over to a new draft vocabulary.

A fresh draft starts its head from the target's: ``lm_head`` rows of the chosen tokens and the target's final
norm. The draft's output is trained to stand in for the target's last hidden state, so this puts the first
steps near the right answer instead of at uniform logits, which matters for small training budgets.

Fine-tuning an ``--init`` draft keeps every weight, and rebuilds the vocabulary from the new answers: rows of
tokens in both vocabularies are carried over, rows of new tokens start from the target's ``lm_head``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specops.errors import SpecopsError
from specops.models.eagle3 import Eagle3Draft
from specops.training import vocab


def load_init(init_dir: Path, target) -> Eagle3Draft:
    """The ``--init`` draft, refused with the reason when it does not fit ``target``."""
    try:
        return Eagle3Draft.load(init_dir, target)
    except SpecopsError as e:
        raise SpecopsError(f"--init draft does not fit the target: {e}") from None


def fresh(target, chosen: torch.Tensor, seed: int, tap_layers: tuple[int, ...] | None = None) -> Eagle3Draft:
    draft = Eagle3Draft.random(target.config, token_ids=chosen.tolist(), seed=seed, tap_layer_ids=tap_layers)
    draft.attach(target)
    with torch.no_grad():
        draft.lm_head.weight.copy_(target.lm_head.weight[chosen.to(target.lm_head.weight.device)])
        draft.norm.weight.copy_(target.model.norm.weight)
    return draft


def revocab(init: Eagle3Draft, target, chosen: torch.Tensor) -> Eagle3Draft:
    """``init`` with its draft vocabulary replaced by ``chosen`` (ascending target ids)."""
    config = {**init.config, "draft_vocab_size": int(chosen.numel())}
    config["eagle_config"] = {**(config.get("eagle_config") or {}),
                              "eagle_aux_hidden_state_layer_ids": list(init.tap_layers)}
    draft = Eagle3Draft(config, target.config)
    state = {k: v for k, v in init.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    draft.load_state_dict(state, strict=False)
    if init.embed_tokens is not None:
        draft.embed_tokens = torch.nn.Embedding.from_pretrained(init.embed_tokens.weight.detach().clone(), freeze=True)
    d2t, t2d = vocab.mapping(chosen, target.config.vocab_size)
    old_ids = (torch.arange(init.draft_vocab_size, device=init.d2t.device) + init.d2t).cpu()
    old_row = {int(t): i for i, t in enumerate(old_ids.tolist())}
    with torch.no_grad():
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
        rows = [init.lm_head.weight[old_row[t]] if t in old_row else target.lm_head.weight[t]
                for t in chosen.tolist()]
        draft.lm_head.weight.copy_(torch.stack(rows).cpu())
    return draft.attach(target)
