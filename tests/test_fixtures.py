"""The committed fixture models: they load, they follow the prompt convention, and the target does the task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specops.fixtures import recipe as fixtures
from specops.fixtures.build import build as build_fixtures
from specops.task import prompt, scoring

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "commerce-tiny"
HELDOUT = 100


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ROOT / "target-merged"))


@pytest.fixture(scope="module")
def heldout():
    return fixtures.heldout_examples(HELDOUT)


def test_shapes_suit_vllm_cpu_and_eagle3():
    for name in ("base", "target-merged"):
        cfg = json.loads((ROOT / name / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["head_dim"] >= 32 and cfg["num_hidden_layers"] >= 8
        assert cfg["tie_word_embeddings"] is False
        assert cfg["rope_parameters"]["rope_type"] == "default"
        assert 2000 <= cfg["vocab_size"] <= 4096
        assert len({2, cfg["num_hidden_layers"] // 2, cfg["num_hidden_layers"] - 3}) == 3


def test_special_ids_and_chat_template(tok):
    cfg = json.loads((ROOT / "target-merged" / "config.json").read_text())
    gen = json.loads((ROOT / "target-merged" / "generation_config.json").read_text())
    eot = tok.convert_tokens_to_ids("<|eot|>")
    assert cfg["eos_token_id"] == gen["eos_token_id"] == tok.eos_token_id == eot
    assert cfg["bos_token_id"] == tok.bos_token_id == tok.convert_tokens_to_ids("<|bos|>")
    assert cfg["pad_token_id"] == tok.pad_token_id == tok.convert_tokens_to_ids("<|pad|>")
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "紅色球鞋"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|system|>\nS<|eot|>\n<|user|>\n紅色球鞋<|eot|>\n<|assistant|>\n"
    ids = list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(tok("藍色 Nike 慢跑鞋 NT$3,000", add_special_tokens=False)["input_ids"]) == "藍色 Nike 慢跑鞋 NT$3,000"


def test_target_does_the_task(tok, heldout):
    model = fixtures.load_model(ROOT / "target-merged")
    texts = fixtures.greedy_answers(model, tok, [e.query for e in heldout], max_new_tokens=fixtures.FULL.max_new_tokens)
    report = scoring.score(texts, [e.gold for e in heldout])
    assert report.valid_rate >= 0.95, report
    assert report.field_accuracy >= 0.80, report


def test_base_is_not_the_task_model(tok, heldout):
    sample = heldout[:30]
    model = fixtures.load_model(ROOT / "base")
    texts = fixtures.greedy_answers(model, tok, [e.query for e in sample], max_new_tokens=fixtures.FULL.max_new_tokens)
    report = scoring.score(texts, [e.gold for e in sample])
    assert report.valid_rate <= 0.2, report


def test_base_plus_lora_equals_merged(tok, heldout):
    from peft import PeftModel

    lora = PeftModel.from_pretrained(fixtures.load_model(ROOT / "base"), str(ROOT / "lora")).eval()
    merged = fixtures.load_model(ROOT / "target-merged")
    e = heldout[0]
    p, a = fixtures.encode_example(tok, e)
    ids = torch.tensor([p + a])
    with torch.no_grad():
        x, y = lora(input_ids=ids).logits, merged(input_ids=ids).logits
    # the merged weights are bf16-rounded sums, so logits agree to rounding, and so do the greedy choices
    assert (x - y).abs().max().item() < 0.05 * y.abs().max().item()
    assert (x.argmax(-1) == y.argmax(-1)).float().mean().item() >= 0.98


@pytest.fixture(scope="module")
def quick_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("quick")
    dirs = [root / "a", root / "b"]
    for d in dirs:
        build_fixtures(d, quick=True)
    return dirs


def _hashes(root: Path) -> dict[str, str]:
    import hashlib

    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file()}


def test_quick_build_is_deterministic(quick_builds):
    a, b = quick_builds
    ha = _hashes(a)
    assert ha == _hashes(b)
    for name in fixtures.SUBDIRS:
        assert any(k.startswith(name + "/") for k in ha)
    assert not list(a.parent.glob(".*partial"))


def test_quick_build_loads(quick_builds):
    from peft import PeftModel
    from transformers import AutoTokenizer

    root = quick_builds[0]
    tok = AutoTokenizer.from_pretrained(str(root / "base"))
    base = fixtures.load_model(root / "base")
    PeftModel.from_pretrained(base, str(root / "lora"))
    merged = fixtures.load_model(root / "target-merged")
    ids = torch.tensor([tok.apply_chat_template(prompt.messages("red shoes"), add_generation_prompt=True,
                                                tokenize=True, return_dict=False)])
    assert merged(input_ids=ids).logits.shape[-1] == merged.config.vocab_size
