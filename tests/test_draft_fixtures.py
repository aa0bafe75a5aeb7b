"""The committed fixture drafts: vLLM's layout, and the study's finding in miniature (greedy, deterministic).

A draft never shown the LoRA target's distribution (``draft-general``) against the same draft fine-tuned on the
target's own answers to commerce queries (``draft-domain``), both in front of the LoRA target on held-out queries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.fixtures import recipe as fixtures
from specops.inputs import query_prompt_ids
from specops.models.eagle3 import Eagle3Draft

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny"
DRAFTS = ("draft-general", "draft-domain")
HELDOUT = 32
LAYER_TENSORS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    *(f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")),
    *(f"midlayer.self_attn.{n}_proj.weight" for n in "qkvo"),
    *(f"midlayer.mlp.{n}_proj.weight" for n in ("gate", "up", "down")),
}



@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Fixed thread count: deterministic, and tiny models only slow down on shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return Engine.load(ROOT / "target-merged", max_seq_len=512)


@pytest.fixture(scope="module")
def runs(engine):
    """Greedy γ = 3 decoding of held-out queries with each draft: outputs and acceptance counters."""
    prompts = [query_prompt_ids(engine.tokenizer, e.query) for e in fixtures.heldout_examples(HELDOUT)]
    out = {}
    for name in DRAFTS:
        spec = Engine(engine.model, engine.tokenizer, draft=Eagle3Draft.load(ROOT / name, engine.model), gamma=3,
                      max_seq_len=512, eos_token_ids=engine.eos_token_ids)
        outputs = spec.generate(prompts, SamplingParams(temperature=0, max_tokens=fixtures.FULL.max_new_tokens))
        out[name] = ([o.token_ids for o in outputs], spec.stats)
    return out


@pytest.mark.parametrize("name", DRAFTS)
def test_vllm_layout(name):
    cfg = json.loads((ROOT / name / "config.json").read_text())
    target = json.loads((ROOT / "target-merged" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["target_hidden_size"] == cfg["hidden_size"] == target["hidden_size"]
    assert cfg["vocab_size"] == target["vocab_size"] > cfg["draft_vocab_size"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    with safe_open(str(ROOT / name / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == LAYER_TENSORS  # no embed_tokens: the target's embedding is shared
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        assert f.get_tensor("fc.weight").shape == (target["hidden_size"], 3 * target["hidden_size"])
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert (torch.arange(d2t.numel()) + d2t).tolist() == t2d.nonzero().flatten().tolist()
    report = json.loads((ROOT / name / "train_report.json").read_text())
    assert report["acceptance"]["after"]["mean_acceptance_length"] > 1.0
    assert "held-out prompts" in (ROOT / name / "README.md").read_text()


def test_domain_draft_is_trained_from_the_general_one():
    report = json.loads((ROOT / "draft-domain" / "train_report.json").read_text())
    assert report["init"] == "../draft-general" and report["target"] == "../target-merged"
    before, after = report["acceptance"]["before"], report["acceptance"]["after"]
    assert after["mean_acceptance_length"] > before["mean_acceptance_length"]


def test_domain_tuning_lengthens_accepted_runs(runs):
    general, domain = runs["draft-general"][1], runs["draft-domain"][1]
    assert general.num_drafts > 0 and domain.num_drafts > 0
    assert domain.mean_acceptance_length >= 1.3 * general.mean_acceptance_length


def test_greedy_output_does_not_depend_on_the_draft(runs):
    assert runs["draft-general"][0] == runs["draft-domain"][0]
