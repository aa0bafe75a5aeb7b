"""peft LoRA adapters: read a ``save_pretrained`` directory and apply it to a model, merged or unmerged.

Merged folds ``W += scale · B @ A`` into the weights once (in float64, rounded once to the compute dtype: the
weights a merged checkpoint would carry, what vLLM serves after merging). Unmerged adds ``x·Aᵀ·Bᵀ·scale`` in the
forward, as an adapter-serving runtime computes it. Both must give the same tokens; the unmerged path exists to
prove that merging changed nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specops.errors import SpecopsError
from specops.files import checkpoint_shapes, load_safetensors, read_json

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
    file: Path  # the adapter file it came from, for errors about the fit to a base model


def read_lora(adapter_dir: Path) -> list[LoRAUpdate]:
    """Parse a peft ``save_pretrained`` directory into one update per adapted linear layer; tensors that
    contradict adapter_config.json (rank, target modules) are refused before any is read."""
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
    files = sorted(adapter_dir.glob("adapter_model*.safetensors"))
    if not files:
        raise SpecopsError(f"{adapter_dir}: no adapter_model.safetensors")
    found = checkpoint_shapes(files)
    r_default, alpha_default = int(cfg.get("r", 8)), float(cfg.get("lora_alpha", 8))
    rank_pattern, alpha_pattern = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    targets = cfg.get("target_modules")
    planned = []
    for name, (a_shape, path) in sorted(found.items()):
        if not name.endswith(".lora_A.weight"):
            if "lora_embedding" in name or "lora_magnitude" in name:
                raise SpecopsError(f"{path}: unsupported adapter tensor {name}")
            continue
        module = name[: -len(".lora_A.weight")].removeprefix("base_model.model.")
        b_name = name.replace(".lora_A.", ".lora_B.")
        if b_name not in found:
            raise SpecopsError(f"{path}: {name} has no matching lora_B")
        b_shape = found[b_name][0]
        key = next((k for k in rank_pattern if module.endswith(k)), None)
        r = int(rank_pattern[key]) if key else r_default
        if len(a_shape) != 2 or len(b_shape) != 2 or not a_shape[0] == b_shape[1] == r:
            raise SpecopsError(f"{path}: {module} has lora_A {a_shape} and lora_B {b_shape}, but {cfg_path} "
                               f"gives it rank {r} (A [{r}, in], B [out, {r}])")
        if not _targeted(module, targets):
            raise SpecopsError(f"{path} adapts {module}, which target_modules {targets} in {cfg_path} does not name")
        key = next((k for k in alpha_pattern if module.endswith(k)), None)
        alpha = float(alpha_pattern[key]) if key else alpha_default
        scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        planned.append((module, name, b_name, scale, path))
    if not planned:
        raise SpecopsError(f"{adapter_dir}: adapter holds no LoRA weights")
    tensors = load_safetensors(files)
    return [LoRAUpdate(module, tensors[a], tensors[b], scale, path) for module, a, b, scale, path in planned]


def _targeted(module: str, targets) -> bool:
    """Whether peft's ``target_modules`` (a list of name suffixes, a regex, or "all-linear") selects ``module``."""
    if targets is None or targets == "all-linear":
        return True
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in targets)


def apply_lora(model: nn.Module, updates: list[LoRAUpdate], mode: str, dtype: torch.dtype) -> None:
    if mode not in MODES:
        raise SpecopsError(f"lora_mode must be 'merged' or 'unmerged', not {mode!r}")
    modules = dict(model.named_modules())
    for u in updates:
        base = modules.get(u.module)
        if not isinstance(base, nn.Linear):
            raise SpecopsError(f"{u.file} adapts {u.module}, which is not a linear layer of this base model "
                               "(an adapter for another base?)")
        out_f, in_f = base.weight.shape
        if u.a.shape[1] != in_f or u.b.shape[0] != out_f:
            raise SpecopsError(
                f"{u.file}: lora_A {tuple(u.a.shape)} and lora_B {tuple(u.b.shape)} of {u.module} do not fit its "
                f"weight {tuple(base.weight.shape)} in this base model (an adapter for another base?)"
            )
        if mode == "merged":
            with torch.no_grad():
                delta = (u.b.double() @ u.a.double()) * u.scale
                base.weight.copy_((base.weight.double() + delta).to(base.weight.dtype))
        else:
            parent_name, _, child = u.module.rpartition(".")
            setattr(modules[parent_name], child, LoRALinear(base, u.a.to(dtype), u.b.to(dtype), u.scale))
