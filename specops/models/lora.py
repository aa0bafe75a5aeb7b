"""peft LoRA adapters: read a ``save_pretrained`` directory and apply it to a model, merged or unmerged.

Merged folds ``W += scale · B @ A`` into the weights once (in float64, rounded once to the compute dtype: the
weights a merged checkpoint would carry, what vLLM serves after merging). Unmerged adds ``x·Aᵀ·Bᵀ·scale`` in the
forward, as an adapter-serving runtime computes it. Both must give the same tokens; the unmerged path exists to
prove that merging changed nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from specops.errors import SpecopsError
from specops.files import read_json

MODES = ("merged", "unmerged")


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
    if mode not in MODES:
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
