"""Load a target model from a local Hugging Face directory, optionally with a peft LoRA adapter.

LoRA is applied either merged (``W += scale · B @ A`` once at load: the served weights are what vLLM serves after
merging) or unmerged (``x·Aᵀ·Bᵀ·scale`` added in the forward, as an adapter-serving runtime computes it).
Both must give the same tokens; the unmerged path exists to prove that merging changed nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from specops.errors import SpecopsError
from specops.models.llama import LlamaConfig, LlamaForCausalLM


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SpecopsError(f"{path}: not valid JSON ({e.msg})") from None


def load_safetensors_dir(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a directory: ``model.safetensors``, a sharded index, or any ``*.safetensors`` files."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index)["weight_map"].values()))
        missing = [f for f in files if not (model_dir / f).is_file()]
        if missing:
            raise SpecopsError(f"{model_dir}: shard(s) listed in the index are missing: {', '.join(missing)}")
        paths = [model_dir / f for f in files]
    else:
        paths = sorted(model_dir.glob("*.safetensors"))
    if not paths:
        raise SpecopsError(f"{model_dir}: no *.safetensors weights found")
    tensors = {}
    for p in paths:
        with safe_open(str(p), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write ``tensors`` (keys sorted, fixed metadata: rebuilds are byte-identical) readable by every user: the
    writer creates files private, and a saved model is shared data that servers run as other users load."""
    save_file({k: tensors[k] for k in sorted(tensors)}, str(path), metadata={"format": "pt"})
    Path(path).chmod(0o644)


class LoRALinear(nn.Module):
    """A linear layer plus an unmerged low-rank update: y = base(x) + scale · (x Aᵀ) Bᵀ."""

    def __init__(self, base: nn.Linear, a: torch.Tensor, b: torch.Tensor, scale: float):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(a, requires_grad=False)
        self.lora_B = nn.Parameter(b, requires_grad=False)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.t()) @ self.lora_B.t() * self.scale


@dataclass
class LoRAUpdate:
    module: str  # e.g. "model.layers.0.self_attn.q_proj"
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float


def read_lora(adapter_dir: Path) -> list[LoRAUpdate]:
    """Parse a peft ``save_pretrained`` directory into one update per adapted linear layer."""
    adapter_dir = Path(adapter_dir)
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise SpecopsError(f"LoRA adapter not found: {cfg_path} is missing")
    cfg = read_json(cfg_path)
    if cfg.get("peft_type", "LORA") != "LORA":
        raise SpecopsError(f"{adapter_dir}: adapter type {cfg.get('peft_type')!r} is not LoRA")
    if cfg.get("use_dora"):
        raise SpecopsError(f"{adapter_dir}: DoRA adapters are not supported")
    if cfg.get("modules_to_save"):
        raise SpecopsError(f"{adapter_dir}: adapters with modules_to_save are not supported (merge them first)")
    if cfg.get("fan_in_fan_out"):
        raise SpecopsError(f"{adapter_dir}: fan_in_fan_out adapters are not supported")
    files = list(adapter_dir.glob("adapter_model*.safetensors"))
    if not files:
        raise SpecopsError(f"{adapter_dir}: no adapter_model.safetensors")
    tensors = {}
    for p in files:
        with safe_open(str(p), framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    r_default, alpha_default = int(cfg.get("r", 8)), float(cfg.get("lora_alpha", 8))
    rank_pattern, alpha_pattern = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    updates = []
    for name, a in sorted(tensors.items()):
        if not name.endswith(".lora_A.weight"):
            if "lora_embedding" in name or "lora_magnitude" in name:
                raise SpecopsError(f"{adapter_dir}: unsupported adapter tensor {name}")
            continue
        module = name[: -len(".lora_A.weight")].removeprefix("base_model.model.")
        b = tensors.get(name.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise SpecopsError(f"{adapter_dir}: {name} has no matching lora_B")
        key = next((k for k in rank_pattern if module.endswith(k)), None)
        r = int(rank_pattern[key]) if key else r_default
        key = next((k for k in alpha_pattern if module.endswith(k)), None)
        alpha = float(alpha_pattern[key]) if key else alpha_default
        scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        updates.append(LoRAUpdate(module, a, b, scale))
    if not updates:
        raise SpecopsError(f"{adapter_dir}: adapter holds no LoRA weights")
    return updates


def apply_lora(model: nn.Module, updates: list[LoRAUpdate], mode: str, dtype: torch.dtype) -> None:
    if mode not in ("merged", "unmerged"):
        raise SpecopsError(f"lora_mode must be 'merged' or 'unmerged', not {mode!r}")
    modules = dict(model.named_modules())
    for u in updates:
        base = modules.get(u.module)
        if not isinstance(base, nn.Linear):
            raise SpecopsError(f"LoRA targets {u.module}, which is not a linear layer of this model")
        out_f, in_f = base.weight.shape
        if u.a.shape[1] != in_f or u.b.shape[0] != out_f or u.a.shape[0] != u.b.shape[1]:
            raise SpecopsError(
                f"LoRA shapes for {u.module} (A {tuple(u.a.shape)}, B {tuple(u.b.shape)}) do not fit its weight "
                f"{tuple(base.weight.shape)}"
            )
        if mode == "merged":
            with torch.no_grad():
                delta = (u.b.double() @ u.a.double()) * u.scale
                base.weight.copy_((base.weight.double() + delta).to(base.weight.dtype))
        else:
            parent_name, _, child = u.module.rpartition(".")
            setattr(modules[parent_name], child, LoRALinear(base, u.a.to(dtype), u.b.to(dtype), u.scale))


def load_target(
    model_dir: str | Path,
    *,
    lora: str | Path | None = None,
    lora_mode: str = "merged",
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_len: int = 4096,
) -> tuple[LlamaForCausalLM, dict]:
    """Model in eval mode on ``device`` plus its raw config dict; every fixable problem is a SpecopsError."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise SpecopsError(f"model directory not found: {model_dir}")
    if not (model_dir / "config.json").is_file():
        raise SpecopsError(f"{model_dir}: no config.json")
    raw = read_json(model_dir / "config.json")
    cfg = LlamaConfig.from_dict(raw)
    state = load_safetensors_dir(model_dir)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_len)
    model.rotary = type(model.rotary)(cfg, max_len)  # real buffers, not meta
    expected = {k for k in model.state_dict() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise SpecopsError(
            f"{model_dir}: weights do not match a {cfg.architecture} of this config "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    for k, v in state.items():
        shape = model.get_parameter(k).shape
        if v.shape != shape:
            raise SpecopsError(f"{model_dir}: tensor {k} has shape {tuple(v.shape)}, config implies {tuple(shape)}")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    if lora is not None:
        # Merged in float64, rounded once to the compute dtype: the weights a merged checkpoint would carry.
        apply_lora(model, read_lora(Path(lora)), lora_mode, dtype)
    return model.to(device).eval(), raw


def load_tokenizer(model_dir: str | Path, vocab_size: int):
    """The model's HF tokenizer, refused if it can emit ids the model has no row for."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as e:
        raise SpecopsError(f"{model_dir}: cannot load tokenizer ({str(e).splitlines()[0]})") from None
    if len(tok) > vocab_size:
        raise SpecopsError(f"tokenizer has {len(tok)} tokens but the model's vocabulary is {vocab_size}")
    special = {k: v for k, v in zip(tok.all_special_tokens, tok.all_special_ids)}
    bad = {k: v for k, v in special.items() if v is None or not 0 <= v < vocab_size}
    if bad:
        raise SpecopsError(f"special token ids out of the model's vocabulary ({vocab_size}): {bad}")
    return tok
