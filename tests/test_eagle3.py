"""EAGLE-3 draft: checkpoint layout and round trip, size checks, target taps, and drafting semantics."""

import json

import pytest
import torch
from engine_helpers import draft_forward, forward, make_target
from safetensors import safe_open

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.errors import SpecopsError
from specops.models.eagle3 import Eagle3Draft
from specops.models.target import load_target

LAYOUT = {
    "fc.weight": (64, 192),
    "midlayer.hidden_norm.weight": (64,),
    "midlayer.input_layernorm.weight": (64,),
    "midlayer.post_attention_layernorm.weight": (64,),
    "midlayer.self_attn.q_proj.weight": (64, 128),
    "midlayer.self_attn.k_proj.weight": (32, 128),
    "midlayer.self_attn.v_proj.weight": (32, 128),
    "midlayer.self_attn.o_proj.weight": (64, 64),
    "midlayer.mlp.gate_proj.weight": (128, 64),
    "midlayer.mlp.up_proj.weight": (128, 64),
    "midlayer.mlp.down_proj.weight": (64, 128),
    "norm.weight": (64,),
    "lm_head.weight": (40, 64),
    "d2t": (40,),
    "t2d": (64,),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    hf = make_target(d, seed=0)
    model, _ = load_target(d, max_len=128)
    return d, hf, model


def test_saved_layout_is_what_vllm_loads(target, tmp_path):
    _, _, model = target
    ids = list(range(3, 43))
    draft = Eagle3Draft.random(model.config, token_ids=ids, seed=0)
    draft.save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 40 and cfg["target_hidden_size"] == 64 and cfg["vocab_size"] == 64
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # (2, N//2, N-3), N = 8
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert shapes == LAYOUT
    assert (torch.arange(40) + d2t).tolist() == ids  # target_id = draft_id + d2t[draft_id]
    assert t2d.nonzero().flatten().tolist() == ids


def test_round_trip_is_bit_exact(target, tmp_path):
    _, _, model = target
    draft = Eagle3Draft.random(model.config, draft_vocab_size=48, seed=5, tap_layer_ids=(1, 3, 6))
    draft.save(tmp_path / "a")
    loaded = Eagle3Draft.load(tmp_path / "a", model)
    a, b = draft.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    assert loaded.tap_layers == (1, 3, 6)
    loaded.save(tmp_path / "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "config.json").read_text() == (tmp_path / "b" / "config.json").read_text()


def test_own_embedding_round_trips(target, tmp_path):
    _, _, model = target
    draft = Eagle3Draft.random(model.config, seed=2)
    draft.embed_tokens = torch.nn.Embedding(64, 64)
    draft.save(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "embed_tokens.weight" in f.keys()
    loaded = Eagle3Draft.load(tmp_path, model)
    assert torch.equal(loaded.embed_tokens.weight, draft.embed_tokens.weight)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"target_hidden_size": 128}, "target hidden size"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 2, 5]}}, "three distinct"),
        ({"architectures": ["LlamaForCausalLM"]}, "not an EAGLE-3 draft"),
    ],
)
def test_mismatched_draft_is_a_clear_error(target, tmp_path, change, message):
    _, _, model = target
    Eagle3Draft.random(model.config, seed=0).save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecopsError, match=message):
        Eagle3Draft.load(tmp_path, model)


def test_draft_for_another_targets_width_is_refused(tmp_path):
    small, _ = load_target(make_target_dir(tmp_path / "t", hidden=64), max_len=64)
    big, _ = load_target(make_target_dir(tmp_path / "u", hidden=96), max_len=64)
    Eagle3Draft.random(big.config, seed=0).save(tmp_path / "d")
    with pytest.raises(SpecopsError, match="hidden size"):
        Eagle3Draft.load(tmp_path / "d", small)


def make_target_dir(d, hidden):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    LlamaForCausalLM(cfg).save_pretrained(str(d))
    return d


def test_taps_are_the_residual_stream_entering_each_layer(target):
    """vLLM taps layer i as hidden_states + residual before layer i runs: HF's hidden_states[i]."""
    _, hf, model = target
    tokens = torch.tensor([[5, 9, 13, 20, 7, 3]])
    ref = hf(tokens, output_hidden_states=True).hidden_states
    logits, taps = forward(model, tokens, tap_layers=(5, 2, 4))
    want = torch.cat([ref[2], ref[4], ref[5]], dim=-1)  # ascending layer order, whatever order was asked
    assert torch.allclose(taps, want, rtol=1e-5, atol=1e-4)
    assert torch.allclose(logits, hf(tokens).logits, rtol=1e-5, atol=1e-4)


def reference_drafts(draft, hf, seq, gamma):
    """Proposals for a request whose committed tokens are ``seq`` (last one not yet verified), computed without
    any cache reuse: the draft pass over (token p+1, fc(HF taps at p)) for every p, then γ − 1 chain steps that
    append (own token, own pre-norm output), each recomputed from scratch."""
    with torch.no_grad():
        hs = hf(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i] for i in draft.tap_layers], dim=-1)
        tokens = torch.tensor([seq[1:]])
        hidden = draft.combine(taps)
        out = []
        for _ in range(gamma):
            t = tokens.shape[1]
            logits, prenorm = draft_forward(draft, tokens, hidden, torch.arange(t)[None], draft.new_cache(1, t),
                                            torch.tensor([0]))
            d = int(logits[0, -1].argmax())
            out.append(d)
            tokens = torch.cat([tokens, torch.tensor([[d]])], dim=1)
            hidden = torch.cat([hidden, prenorm[:, -1:]], dim=1)
        return out


def test_proposals_match_a_cacheless_reference_across_rounds(target):
    """Rejected positions, rollback and the draft cache's overwrites leave the proposals exactly as if each
    round were recomputed from scratch with vLLM's input shift and hidden-state feedback."""
    _, hf, model = target
    draft = Eagle3Draft.random(model.config, seed=3)
    with torch.no_grad():
        for p in draft.parameters():
            p.mul_(20.0)  # peaked draft logits: argmax is robust to float noise
        for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
            getattr(draft.midlayer, n).weight.fill_(1.0)
        draft.norm.weight.fill_(1.0)
    eng = Engine(model, None, draft=draft, gamma=3, max_batch=2, max_seq_len=64, eos_token_ids=[])
    prompts = {"a": [4, 8, 15, 16, 23], "b": [42, 7, 9]}
    for rid, p in prompts.items():
        eng.add_request(rid, p, SamplingParams(temperature=0, max_tokens=20))
    generated = {rid: [] for rid in prompts}
    rounds = 0
    while eng.has_unfinished():
        for so in eng.step():
            generated[so.request_id] += so.new_token_ids
        for slot, req in eng.scheduler.running.items():
            seq = req.prompt + req.out
            assert eng.runner.drafts[slot].tolist() == reference_drafts(draft, hf, seq, 3)
            rounds += 1
    assert rounds >= 8
