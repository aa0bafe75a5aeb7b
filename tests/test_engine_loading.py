"""Loading targets and LoRA adapters: merged == unmerged, and every unfixable input is a one-line SpecopsError."""

import json
import shutil

import pytest
import torch
from engine_helpers import forward, make_target, save_char_tokenizer
from peft import LoraConfig, get_peft_model

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.errors import SpecopsError
from specops.models.llama import fuse_projections
from specops.models.target import load_target


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    """A target plus a seeded random peft adapter (non-zero B, so the adapter changes the model)."""
    root = tmp_path_factory.mktemp("lora")
    hf = make_target(root / "base", seed=0)
    torch.manual_seed(1)
    peft_model = get_peft_model(
        hf, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"],
                       lora_dropout=0.0)
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    peft_model.save_pretrained(str(root / "adapter"))
    merged = peft_model.merge_and_unload().eval()
    return root, merged


def test_unmerged_equals_merged_and_peft(lora_setup):
    root, peft_merged = lora_setup
    base, _ = load_target(root / "base", max_len=64)
    merged, _ = load_target(root / "base", lora=root / "adapter", lora_mode="merged", max_len=64)
    unmerged, _ = load_target(root / "base", lora=root / "adapter", lora_mode="unmerged", max_len=64)
    tokens = torch.tensor([[5, 9, 13, 20, 7, 3, 30, 11]])
    pos = torch.arange(8)[None]
    out = {}
    for name, m in (("base", base), ("merged", merged), ("unmerged", unmerged)):
        with torch.no_grad():
            out[name], _ = forward(m, tokens, pos)
    # Fusing leaves layers that carry an unmerged adapter as they are (q, v, gate here) and stacks only plain ones.
    with torch.no_grad():
        out["unmerged, fused"], _ = forward(fuse_projections(unmerged), tokens, pos)
    ref = peft_merged(tokens).logits
    assert torch.allclose(out["merged"], ref, atol=1e-4)
    assert torch.allclose(out["unmerged"], out["merged"], atol=1e-4)
    assert torch.allclose(out["unmerged, fused"], out["merged"], atol=1e-4)
    layer = unmerged.model.layers[0]
    assert layer.self_attn.qkv_proj is None and layer.mlp.gate_up_proj is None  # their parts carry the adapter
    assert not torch.allclose(out["base"], out["merged"], atol=1e-2)  # the adapter matters


def test_unmerged_greedy_tokens_equal_merged(lora_setup):
    root, _ = lora_setup
    prompts = [[5, 9, 13], [20, 7, 3, 30, 11, 4], [8]]
    outs = {}
    for mode in ("merged", "unmerged"):
        eng = Engine.load(root / "base", lora=root / "adapter", lora_mode=mode, gamma=0, max_seq_len=64)
        outs[mode] = [o.token_ids for o in eng.generate(prompts, SamplingParams(temperature=0, max_tokens=20))]
    assert outs["merged"] == outs["unmerged"]


def test_lora_that_does_not_fit_is_refused(lora_setup, tmp_path):
    root, _ = lora_setup
    bad = tmp_path / "adapter"
    shutil.copytree(root / "adapter", bad)
    cfg = json.loads((bad / "adapter_config.json").read_text())
    from safetensors.torch import load_file, save_file

    state = load_file(str(bad / "adapter_model.safetensors"))
    key = next(k for k in state if k.endswith("q_proj.lora_A.weight"))
    state[key] = torch.zeros(4, 32)  # q_proj takes 64 inputs
    save_file(state, str(bad / "adapter_model.safetensors"))
    with pytest.raises(SpecopsError, match="do not fit"):
        load_target(root / "base", lora=bad)
    state[key.replace("q_proj", "nonexistent")] = state.pop(key)
    key_b = key.replace("lora_A", "lora_B")
    state[key_b.replace("q_proj", "nonexistent")] = state.pop(key_b)
    save_file(state, str(bad / "adapter_model.safetensors"))
    with pytest.raises(SpecopsError, match="which target_modules .* does not name"):
        load_target(root / "base", lora=bad)
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(SpecopsError, match="DoRA"):
        load_target(root / "base", lora=bad)
    with pytest.raises(SpecopsError, match="adapter_config.json"):
        load_target(root / "base", lora=tmp_path / "missing")
    with pytest.raises(SpecopsError, match="lora_mode"):
        load_target(root / "base", lora=root / "adapter", lora_mode="fused")


def test_unusable_model_dirs_are_clear_errors(lora_setup, tmp_path):
    root, _ = lora_setup
    with pytest.raises(SpecopsError, match="not found"):
        Engine.load(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(root / "base" / "config.json", empty / "config.json")
    with pytest.raises(SpecopsError, match="no .*safetensors"):
        Engine.load(empty)
    arch = tmp_path / "arch"
    shutil.copytree(root / "base", arch)
    cfg = json.loads((arch / "config.json").read_text())
    (arch / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(SpecopsError, match="unsupported architecture"):
        Engine.load(arch)


def test_tokenizer_larger_than_model_vocab_is_refused(tmp_path):
    make_target(tmp_path, seed=0, vocab_size=64)
    save_char_tokenizer(tmp_path, chars="".join(chr(c) for c in range(0x4E00, 0x4E00 + 80)))  # 83 tokens
    with pytest.raises(SpecopsError, match="tokenizer.json has 83 tokens"):
        Engine.load(tmp_path)


def test_sharded_checkpoint_loads(lora_setup, tmp_path):
    root, _ = lora_setup
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(root / "base"))
    hf.save_pretrained(str(tmp_path), max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    a, _ = load_target(root / "base", max_len=32)
    b, _ = load_target(tmp_path, max_len=32)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _tiny(cls_name, **kw):
    import transformers

    cfg = getattr(transformers, cls_name + "Config")(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=256, **kw)
    return getattr(transformers, cls_name + "ForCausalLM")(cfg).eval()


@pytest.mark.parametrize("cls_name, kw", [
    ("Llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    ("Llama", dict(tie_word_embeddings=True, attention_bias=True, rope_theta=500000.0)),
    ("Mistral", dict(sliding_window=None)),
    ("Qwen2", dict()),
    ("Qwen3", dict()),
], ids=["llama3-rope", "llama-tied-bias", "mistral", "qwen2", "qwen3"])
def test_forward_matches_transformers_per_architecture(tmp_path, cls_name, kw):
    torch.manual_seed(0)
    hf = _tiny(cls_name, **kw)
    with torch.no_grad():
        for name, p in hf.named_parameters():  # random biases and norms too, so every term is exercised
            p.normal_(0, 0.3 if p.dim() == 2 else 0.5)
    hf.save_pretrained(str(tmp_path))
    model, _ = load_target(tmp_path, max_len=128)
    tokens = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = forward(model, tokens)
        ref = hf(tokens).logits
        fused, _ = forward(fuse_projections(model), tokens)
    assert torch.allclose(ours, ref, rtol=1e-4, atol=1e-4)
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj is not None and layer.mlp.gate_up_proj is not None
    assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "up_proj")
    assert torch.allclose(fused, ref, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # only the asked-for position's logits, as a prefill takes them
        last, _ = forward(model, tokens, logits_at=torch.tensor([39, 40 + 17]))  # flat indices into the 2 × 40
    assert last.shape == (2, 64) and torch.allclose(last, fused[[0, 1], [39, 17]], rtol=1e-5, atol=1e-5)


def test_context_beyond_a_sliding_window_is_refused(tmp_path):
    _tiny("Mistral", sliding_window=32).save_pretrained(str(tmp_path))
    save_char_tokenizer(tmp_path)
    with pytest.raises(SpecopsError, match="sliding window"):
        Engine.load(tmp_path, max_seq_len=64)
    assert Engine.load(tmp_path, max_seq_len=32).max_seq_len == 32
