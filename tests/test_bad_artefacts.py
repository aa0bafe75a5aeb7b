"""Damaged or mismatched model files: loading fails with one SpecopsError naming the file and the mismatch, and the
CLI reports it on one line with exit code 2. Each case copies a fixture directory and damages it one way."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from serve_helpers import FIXTURE, REPO, free_port

from specops.engine.engine import Engine
from specops.errors import SpecopsError
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaConfig

BASE_CONFIG = json.loads((FIXTURE / "base" / "config.json").read_text())


def truncate(name):
    def damage(d):
        p = d / name
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
        return p
    return damage


def overwrite(name, text):
    def damage(d):
        (d / name).write_text(text)
        return d / name
    return damage


def edit_json(name, **changes):
    def damage(d):
        p = d / name
        p.write_text(json.dumps({**json.loads(p.read_text()), **changes}))
        return p
    return damage


def edit_tensors(name, change):
    def damage(d):
        p = d / name
        state = load_file(str(p))
        change(state)
        save_file(state, str(p))
        return p
    return damage


def draft_for(**target_changes):
    """Replace the draft with a random one saved for a target shaped like the base with ``target_changes``."""
    def damage(d):
        shutil.rmtree(d)
        Eagle3Draft.random(LlamaConfig.from_dict({**BASE_CONFIG, **target_changes}), draft_vocab_size=64).save(d)
        return d / "config.json"
    return damage


def draft_claiming_this_target(d):
    """A draft for a wider target whose config.json was edited to claim this one's width: its fc weight tells."""
    draft_for(hidden_size=256)(d)
    edit_json("config.json", target_hidden_size=128)(d)
    return d / "model.safetensors"


def add_tokens(special: bool):
    """Append tokens past the model's 3072 ids to tokenizer.json; ``special``: one, made the EOS token."""
    def damage(d):
        tj = json.loads((d / "tokenizer.json").read_text())
        names = ["<|tool|>"] if special else [f"<|extra{i}|>" for i in range(5)]
        tj["added_tokens"] += [{"id": 3072 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": special} for i, t in enumerate(names)]
        (d / "tokenizer.json").write_text(json.dumps(tj))
        if special:
            for f in ("tokenizer_config.json", "special_tokens_map.json"):
                edit_json(f, eos_token="<|tool|>")(d)
        return d / "tokenizer.json"
    return damage


def wide_q_proj(state):
    """The q_proj update of an adapter trained on a base twice as wide."""
    for k in [k for k in state if "q_proj" in k]:
        state[k] = torch.zeros(64, 256) if "lora_A" in k else torch.zeros(256, 64)


def gpt2_adapter(d):
    """An adapter of a GPT-2 base: its fused attention projection, by GPT-2's module names."""
    def rename(state):
        for k in list(state):
            name = k.replace("model.layers", "transformer.h").replace("self_attn.q_proj", "attn.c_attn")
            v = state.pop(k)
            if "c_attn" in name:
                state[name] = v
    edit_json("adapter_config.json", target_modules=["c_attn"])(d)
    return edit_tensors("adapter_model.safetensors", rename)(d)


# (case, artefact damaged, damage, the mismatch the error must state). A damage returns the file to be named.
CASES = [
    ("model truncated", "model", truncate("model.safetensors"), r"truncated \(\d+ bytes; its header describes \d+\)"),
    ("model not safetensors", "model", overwrite("model.safetensors", "<html>404</html>"),
     "truncated or not a safetensors file"),
    ("hidden_size", "model", edit_json("config.json", hidden_size=256), r"says hidden_size 256, but .* holds 128"),
    ("num_hidden_layers", "model", edit_json("config.json", num_hidden_layers=6),
     r"says num_hidden_layers 6, but .* holds 8 layers"),
    ("vocab_size", "model", edit_json("config.json", vocab_size=4096), r"says vocab_size 4096, but .* holds 3072"),
    ("intermediate_size", "model", edit_json("config.json", intermediate_size=512),
     r"down_proj.weight has shape \(128, 384\), expected \(128, 512\)"),
    ("config field missing", "model", edit_json("config.json", num_attention_heads=None),
     "num_attention_heads missing or not a positive integer"),
    ("tensor missing", "model", edit_tensors("model.safetensors", lambda s: s.pop("model.layers.3.mlp.up_proj.weight")),
     r"missing 1 tensor\(s\) \(model.layers.3.mlp.up_proj.weight\)"),
    ("tensor unexpected", "model", edit_tensors("model.safetensors", lambda s: s.update(extra=torch.zeros(2))),
     r"unexpected 1 tensor\(s\) \(extra\)"),
    ("draft truncated", "draft", truncate("model.safetensors"), "truncated"),
    ("draft for a wider target", "draft", draft_for(hidden_size=256),
     "draft trained for a target hidden size of 256, this target has 128"),
    ("draft for a wider target, config edited", "draft", draft_claiming_this_target,
     r"draft trained for a target hidden size of 256 \(fc.weight is \(256, 768\)\), this target has 128"),
    ("draft for a larger vocabulary", "draft", draft_for(vocab_size=4096),
     "draft trained for a target vocab_size of 4096, this target has 3072"),
    ("draft for a deeper target", "draft", draft_for(num_hidden_layers=16), r"in \[0, 8\); got \[2, 8, 13\]"),
    ("draft d2t", "draft", edit_tensors("model.safetensors", lambda s: s.update(d2t=s["d2t"] + 3000)),
     r"d2t maps draft ids to target ids 3000\.\.\d+, outside this target's vocabulary of 3072"),
    ("draft_vocab_size", "draft", edit_json("config.json", draft_vocab_size=2048),
     r"d2t has shape \(1024,\), expected \(2048,\)"),
    ("lora truncated", "lora", truncate("adapter_model.safetensors"), "truncated"),
    ("lora for a wider base", "lora", edit_tensors("adapter_model.safetensors", wide_q_proj),
     r"lora_A \(64, 256\) and lora_B \(256, 64\) of model.layers.0.self_attn.q_proj do not fit its weight "
     r"\(128, 128\)"),
    ("lora for another architecture", "lora", gpt2_adapter,
     r"adapts transformer.h.0.attn.c_attn, which is not a linear layer of this base model"),
    ("lora rank", "lora", edit_json("adapter_config.json", r=32), r"gives it rank 32"),
    ("lora target_modules", "lora", edit_json("adapter_config.json", target_modules=["q_proj", "v_proj"]),
     r"adapts model.layers.0.mlp.down_proj, which target_modules \['q_proj', 'v_proj'\]"),
    ("tokenizer larger than the vocabulary", "model", add_tokens(special=False),
     r"has 3077 tokens with ids up to 3076, beyond the model's vocabulary of 3072"),
    ("special token beyond the vocabulary", "model", add_tokens(special=True),
     r"special token ids outside the model's vocabulary of 3072 .*'<\|tool\|>': 3072"),
]
BY_NAME = {case[0]: case for case in CASES}
SOURCES = {"model": "base", "draft": "draft-domain", "lora": "lora"}  # the fixture each kind of case damages


def damaged(tmp_path, name):
    """(model, draft and lora paths with the damaged copy in place, the file the error must name, its pattern)."""
    _, artefact, damage, pattern = BY_NAME[name]
    d = tmp_path / artefact
    shutil.copytree(FIXTURE / SOURCES[artefact], d)
    bad_file = damage(d)
    return {"model": FIXTURE / "base", "draft": None, "lora": None, artefact: d}, bad_file, pattern


@pytest.mark.parametrize("name", list(BY_NAME))
def test_engine_load_names_the_file_and_the_mismatch(tmp_path, name):
    paths, bad_file, pattern = damaged(tmp_path, name)
    with pytest.raises(SpecopsError, match=pattern) as err:
        Engine.load(paths["model"], draft=paths["draft"], lora=paths["lora"], max_seq_len=64, cuda_graphs=False)
    assert str(bad_file) in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("command, name", [
    ("generate", "model truncated"),
    ("generate", "draft for a wider target"),
    ("generate", "tokenizer larger than the vocabulary"),
    ("serve", "lora for a wider base"),
    ("serve --engine-process", "lora for a wider base"),  # the engine process's load error, as the server's
])
def test_cli_reports_one_line_and_exits_2(tmp_path, command, name):
    paths, bad_file, pattern = damaged(tmp_path, name)
    args = [sys.executable, "-m", "specops", *command.split(), "--model", str(paths["model"])]
    args += [a for flag in ("draft", "lora") if paths[flag] for a in (f"--{flag}", str(paths[flag]))]
    if command == "generate":
        (tmp_path / "prompts.jsonl").write_text('{"id": "q1", "query": "red running shoes under 50 dollars"}\n')
        args += ["--prompts", str(tmp_path / "prompts.jsonl"), "--out", str(tmp_path / "out.jsonl")]
    else:
        args += ["--port", str(free_port())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(bad_file) in errors[0] and re.search(pattern, errors[0]), proc.stderr
    assert not (tmp_path / "out.jsonl").exists()
