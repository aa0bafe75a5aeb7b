"""Acceptance of a draft on held-out prompts, measured by the engine itself (greedy, γ = 3, vLLM's formulas)."""

from __future__ import annotations

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams

GAMMA = 3


def acceptance(base: Engine, draft, prompts: list[list[int]], max_tokens: int, gamma: int = GAMMA) -> dict:
    """Speculative counters of greedy decoding of ``prompts`` with ``draft`` in front of ``base``'s target."""
    engine = Engine(base.model, base.tokenizer, draft=draft, gamma=gamma, max_batch=base.max_batch,
                    max_seq_len=base.max_seq_len, eos_token_ids=base.eos_token_ids)
    engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    stats = engine.stats
    return {
        "prompts": len(prompts),
        "gamma": gamma,
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "per_position_rate": stats.per_position_rate(),
        "num_drafts": stats.num_drafts,
    }
