"""The training loop: TTT loss, AdamW with warm-up + cosine decay, gradient clipping, resumable checkpoints.

The batch of step ``s`` is a pure function of (seed, s) and there is no dropout, so a run resumed from the
checkpoint of step ``s`` replays exactly what an uninterrupted run would have done: same final weights.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from specops.files import write_atomic
from specops.training import ttt
from specops.training.data import Example, Features, forward_features
from specops.training.schedule import adamw, cosine_lr, optimizer_step


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = 1.0
    batch_size: int = 16
    lr: float = 2e-3
    warmup: float = 0.05  # fraction of the steps
    min_lr: float = 0.1  # cosine floor, fraction of the peak
    weight_decay: float = 0.0
    clip: float = 1.0
    ttt_steps: int = 3
    decay: float = ttt.DECAY
    checkpoint_every: int = 50
    seed: int = 0


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] right-padded with 0
    lengths: torch.Tensor  # [B]
    prompt_lengths: torch.Tensor  # [B]
    taps: torch.Tensor  # [B, T, 3·H]
    final: torch.Tensor  # [B, T, H]


class Data:
    """Training examples with their target features: cached (``features``) or computed per batch (``target``)."""

    def __init__(self, examples: list[Example], features: list[Features] | None, target, tap_layers, device):
        self.examples, self.features, self.target = examples, features, target
        self.tap_layers, self.device = tuple(tap_layers), torch.device(device)

    def __len__(self) -> int:
        return len(self.examples)

    def batch(self, idx: list[int]) -> Batch:
        rows = [self.examples[i] for i in idx]
        feats = ([self.features[i] for i in idx] if self.features is not None
                 else forward_features(self.target, [e.tokens for e in rows], self.tap_layers, self.device))
        width = max(len(e.tokens) for e in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        taps = torch.zeros(len(rows), width, feats[0].taps.shape[-1])
        final = torch.zeros(len(rows), width, feats[0].final.shape[-1])
        for r, (e, f) in enumerate(zip(rows, feats)):
            n = len(e.tokens)
            tokens[r, :n] = torch.tensor(e.tokens)
            taps[r, :n], final[r, :n] = f.taps.float(), f.final.float()
        d = self.device
        return Batch(tokens.to(d), torch.tensor([len(e.tokens) for e in rows], device=d),
                     torch.tensor([len(e.prompt) for e in rows], device=d), taps.to(d), final.to(d))


def schedule(n: int, cfg: TrainConfig) -> tuple[int, Callable[[int], list[int]]]:
    """Total steps and the example indices of each step (a fresh seeded permutation per epoch)."""
    per_epoch = math.ceil(n / cfg.batch_size)
    total = max(1, round(per_epoch * cfg.epochs))

    def indices(step: int) -> list[int]:
        epoch, slot = divmod(step, per_epoch)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch))
        return order[slot * cfg.batch_size : (slot + 1) * cfg.batch_size].tolist()

    return total, indices


def save_checkpoint(path: Path, step: int, draft, opt, key: str, tail: dict | None = None) -> None:
    """``tail``: the report's sums so far, so a run resumed in its last tenth (or after it) reports all of it."""
    buf = io.BytesIO()
    torch.save({"step": step, "key": key, "draft": draft.state_dict(), "opt": opt.state_dict(), "tail": tail}, buf)
    write_atomic(path, buf.getvalue())


def load_checkpoint(path: Path, draft, opt, key: str) -> tuple[int, dict | None]:
    """Restore draft and optimizer from ``path`` if it belongs to this run; the step to continue from and the
    report's sums saved with it."""
    if not path.is_file():
        return 0, None
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("key") != key:
        return 0, None
    draft.load_state_dict(state["draft"])
    opt.load_state_dict(state["opt"])
    return int(state["step"]), state.get("tail")


Progress = Callable[[int, int, ttt.StepResult], None]  # (step done, total, result of that step)


def teacher_logits(target, final: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return target.lm_head(target.model.norm(final))


def train(draft, target, data: Data, cfg: TrainConfig, checkpoint: Path, key: str,
          progress: Progress = lambda step, total, result: None) -> dict:
    """Train ``draft`` in place; resumes from ``checkpoint`` when it holds a state of the same run (``key``)."""
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = adamw(params, cfg.lr, cfg.weight_decay)
    total, indices = schedule(len(data), cfg)
    key = f"{key}:{asdict(cfg)}"
    start, saved = load_checkpoint(checkpoint, draft, opt, key)
    device = data.device
    draft.train()
    # Reported accuracy covers the last tenth of the run: what the finished draft does, not its first steps.
    tail_from = total - max(1, total // 10)
    sums = saved or {"loss": 0.0, "correct": [0] * cfg.ttt_steps, "count": [0] * cfg.ttt_steps, "steps": 0}
    for step in range(start, total):
        batch = data.batch(indices(step))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            teach = ttt.teacher(teacher_logits(target, batch.final), draft.t2d)
            logits = ttt.unroll(draft, batch.tokens, batch.taps, cfg.ttt_steps)
            result = ttt.ttt_loss(logits, teach, batch.lengths, batch.prompt_lengths, cfg.decay)
        optimizer_step(opt, params, result.loss, cosine_lr(step, total, cfg.lr, cfg.warmup, cfg.min_lr), cfg.clip)
        if step >= tail_from:
            sums["loss"] += result.loss.item()
            sums["steps"] += 1
            for k in range(cfg.ttt_steps):
                sums["correct"][k] += result.step_correct[k]
                sums["count"][k] += result.step_counts[k]
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == total:
            save_checkpoint(checkpoint, step + 1, draft, opt, key, sums)
        progress(step + 1, total, result)
    draft.eval()
    return {
        "steps": total,
        "resumed_at": start,
        "final_loss": sums["loss"] / max(1, sums["steps"]),
        "step_accuracy": [c / n if n else 0.0 for c, n in zip(sums["correct"], sums["count"])],
    }
