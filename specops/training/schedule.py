"""The optimisation step every training loop here uses: AdamW, linear warm-up then cosine decay, grad clipping."""

from __future__ import annotations

import math

import torch


def adamw(params, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


def cosine_lr(step: int, total: int, peak: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """Linear warm-up over a ``warmup`` fraction of the steps, then cosine decay to ``floor`` × ``peak``."""
    warm = max(1, round(total * warmup))
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def optimizer_step(opt: torch.optim.Optimizer, params, loss: torch.Tensor, lr: float, clip: float = 1.0) -> None:
    """Backpropagate ``loss`` and take one clipped step at learning rate ``lr``."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
