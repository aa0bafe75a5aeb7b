"""Fixture drafts for ``fixtures/commerce-tiny``: the study's finding in miniature.

- ``draft-general/``: trained on the **base** model's answers to prompts from the general text mix: the stand-in
  for a published draft that never saw the fine-tuned target's distribution;
- ``draft-domain/``: ``draft-general`` fine-tuned on the **LoRA target's** (``target-merged``) answers to
  synthetic commerce queries (none of them a held-out query of the fixture set).

On held-out commerce queries with the LoRA target, the domain draft is accepted for markedly longer runs.
Seeded, deterministic algorithms, a fixed thread count: rebuilding on one machine gives the same files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from specops.training import pipeline
from specops.training.train import TrainConfig

THREADS = 1  # tiny matrices gain little from more, and oversubscribed cores slow them down many times


@dataclass(frozen=True)
class DraftRecipe:
    general_prompts: int = 1200
    general_max_tokens: int = 64
    general_epochs: float = 2.0
    domain_prompts: int = 600
    domain_max_tokens: int = 160
    domain_epochs: float = 2.0
    draft_vocab_size: int = 1024
    ttt_steps: int = 3
    batch_size: int = 16
    lr: float = 3e-3
    domain_lr: float = 2e-3
    eval_prompts: int = 32


FULL = DraftRecipe()
QUICK = replace(FULL, general_prompts=40, general_max_tokens=12, general_epochs=1.0, domain_prompts=40,
                domain_max_tokens=24, domain_epochs=1.0, eval_prompts=4)


def _jobs(root: Path, recipe: DraftRecipe, seed: int) -> tuple[pipeline.Job, pipeline.Job]:
    from specops.models import fixtures as models

    heldout = tuple(e.query for e in models.heldout_examples(models.FULL.eval_examples))
    train = TrainConfig(batch_size=recipe.batch_size, ttt_steps=recipe.ttt_steps, seed=seed)
    general = pipeline.Job(
        target=root / "base", out=root / "draft-general",
        source=pipeline.Source("general", recipe.general_prompts),
        draft_vocab_size=recipe.draft_vocab_size, max_new_tokens=recipe.general_max_tokens,
        eval_prompts=recipe.eval_prompts, train=replace(train, epochs=recipe.general_epochs, lr=recipe.lr),
    )
    domain = pipeline.Job(
        target=root / "target-merged", out=root / "draft-domain",
        source=pipeline.Source("synthetic", recipe.domain_prompts, exclude=heldout),
        init=root / "draft-general", draft_vocab_size=recipe.draft_vocab_size,
        max_new_tokens=recipe.domain_max_tokens, eval_prompts=recipe.eval_prompts,
        train=replace(train, epochs=recipe.domain_epochs, lr=recipe.domain_lr, seed=seed + 2),
    )
    return general, domain


def build_drafts(fixtures_dir: str | Path, quick: bool = False, seed: int = 0,
                 progress: Callable[[str, int, int, float], None] | None = None) -> dict:
    """Train ``draft-general/`` then ``draft-domain/`` into ``fixtures_dir``; returns both training reports.

    ``progress(stage, step, total, loss)`` has the fixture recipe's signature (loss is NaN outside training).
    """
    root = Path(fixtures_dir)
    for name in ("base", "target-merged"):
        if not (root / name / "config.json").is_file():
            raise FileNotFoundError(f"{root / name} is missing: build the fixture models first")
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    progress = progress or (lambda *_: None)
    reports = {}
    for job in _jobs(root, QUICK if quick else FULL, seed):
        name = job.out.name
        reports[name] = pipeline.run(
            job, lambda stage, d, t, f, n=name: progress(f"{n}:{stage}", d, t, f.get("loss", math.nan)))
    return reports
