"""Fold a LoRA adapter into a copy of the target, for servers that cannot combine an adapter with EAGLE-3.

vLLM's CPU build crashes when LoRA and an EAGLE-3 draft are used together; serving the merged weights avoids it
and is what production does with a single fine-tune. The merge is specops' own (float64, rounded once), so the
merged directory holds the weights the embedded engine computes with in merged mode.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from specops.models.target import load_safetensors_dir, load_target, save_safetensors


def merge_lora(model_dir: Path, lora_dir: Path, out_dir: Path) -> Path:
    """Write ``model_dir`` with ``lora_dir`` merged (float32 weights, same config and tokenizer) into ``out_dir``."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    names = set(load_safetensors_dir(model_dir))
    model, _ = load_target(model_dir, lora=lora_dir, lora_mode="merged", dtype=torch.float32)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if k in names}
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out_dir / f.name)
    save_safetensors(state, out_dir / "model.safetensors")
    return out_dir
