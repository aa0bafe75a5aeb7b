"""specops' engine against real vLLM (CPU build) on the same model, EAGLE-3 draft and prompt token ids.

Both run greedy in float32 on task prompts rendered once by the model's chat template. They must produce the
same tokens on at least 95 % of the prompts and a mean acceptance length within 5 % of each other: the same
verification rule on the same draft gives the same accepted runs, so a larger gap means one of them drafts or
counts differently. Slow (one vLLM start, about a minute); needs SPECOPS_VLLM_PYTHON (``make test`` sets it).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from specops.analysis.acceptance import Tally
from specops.analysis.alignment import token_classes
from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.engine.stats import SpecStats
from specops.files import read_json
from specops.inputs import query_prompt_ids
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaConfig
from specops.peers.vllm.offline import VllmRequest, run_vllm
from specops.task import synth

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "commerce-tiny"
MODEL = FIXTURE / "target-merged"
TRAINED_DRAFT = FIXTURE / "draft-domain"
VLLM_PYTHON = os.environ.get("SPECOPS_VLLM_PYTHON")
GAMMA = 3
NUM_PROMPTS = 24
MAX_TOKENS = 64


def _vllm_unusable() -> str | None:
    """Why the vLLM python cannot be used, or None. Importing vllm takes 10-30 s, so only look it up."""
    if not VLLM_PYTHON:
        return "SPECOPS_VLLM_PYTHON is not set (make test sets it after scripts/setup_vllm_env.sh)"
    if not Path(VLLM_PYTHON).is_file():
        return f"SPECOPS_VLLM_PYTHON={VLLM_PYTHON} does not exist"
    probe = subprocess.run([VLLM_PYTHON, "-c", "import importlib.util as u; assert u.find_spec('vllm')"],
                           capture_output=True, timeout=60)
    return None if probe.returncode == 0 else f"{VLLM_PYTHON} has no vllm package"


_REASON = _vllm_unusable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    assert (MODEL / "config.json").is_file(), f"fixture model missing: {MODEL} (build it with `make fixtures`)"
    return MODEL


@pytest.fixture(scope="module")
def draft_dirs(model_dir, tmp_path_factory) -> list[Path]:
    """A seeded random draft (reduced vocabulary, as published heads have) and, when built, the trained one."""
    cfg = LlamaConfig.from_dict(read_json(model_dir / "config.json"))
    random_dir = Eagle3Draft.random(cfg, draft_vocab_size=cfg.vocab_size // 2, seed=0).save(
        tmp_path_factory.mktemp("draft") / "random")
    return [random_dir] + ([TRAINED_DRAFT] if (TRAINED_DRAFT / "config.json").is_file() else [])


def test_greedy_outputs_and_acceptance_match_vllm(model_dir, draft_dirs):
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [query_prompt_ids(tok, ex.query) for ex in synth.generate(NUM_PROMPTS, seed=7)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    for draft in draft_dirs:
        engine = Engine.load(model_dir, draft=draft, gamma=GAMMA, max_batch=16)
        ours = engine.generate(prompts, params, provenance=True)
        ours_spec = SpecStats()
        for o in ours:
            ours_spec.merge(o.spec)
        theirs = run_vllm(model_dir, [VllmRequest("greedy", prompts, params)], draft=draft, gamma=GAMMA,
                          max_num_seqs=16).run("greedy")

        same = [o.token_ids == t.token_ids for o, t in zip(ours, theirs.outputs)]
        assert sum(same) >= 0.95 * len(prompts), (
            f"{draft.name}: only {sum(same)}/{len(prompts)} greedy outputs agree; first differing prompt "
            f"{same.index(False)}: ours {ours[same.index(False)].token_ids[:24]} vs vLLM "
            f"{theirs.outputs[same.index(False)].token_ids[:24]}")
        assert all(o.finish_reason == t.finish_reason for o, t, s in zip(ours, theirs.outputs, same) if s)
        assert ours_spec.num_drafts > 0 and theirs.spec.num_drafts > 0, "speculative decoding did not run"
        a, b = ours_spec.mean_acceptance_length, theirs.spec.mean_acceptance_length
        assert abs(a - b) <= 0.05 * b, f"{draft.name}: mean acceptance length {a:.3f} (specops) vs {b:.3f} (vLLM)"
        if all(same):  # the same tokens: the acceptance analysis' per-class counts add up to vLLM's counters
            tally = Tally(GAMMA)
            for o in ours:
                tally.add(token_classes(tok, o.token_ids), o.provenance)
            assert tally.num_accepted == theirs.spec.num_accepted_tokens and tally.rounds == theirs.spec.num_drafts
            assert sum(tally.summary()["class_counts"][c]["accepted"] for c in tally.accepted) == tally.num_accepted
