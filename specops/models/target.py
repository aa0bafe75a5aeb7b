"""A target model from a local Hugging Face directory (optionally with a LoRA adapter), its tokenizer and EOS ids,
and a merged copy of target + adapter for servers that cannot combine an adapter with EAGLE-3."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from specops.errors import SpecopsError, naming
from specops.files import (
    check_shapes,
    checkpoint_shapes,
    load_safetensors,
    read_json,
    safetensors_files,
    save_safetensors,
)
from specops.models.llama import LlamaConfig, LlamaForCausalLM
from specops.models.lora import apply_lora, read_lora


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
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise SpecopsError(f"{model_dir}: no config.json")
    raw = read_json(config_path)
    with naming(str(config_path)):
        cfg = LlamaConfig.from_dict(raw)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_len)
    model.rotary = type(model.rotary)(cfg, max_len)  # real buffers, not meta
    tied = cfg.tie_word_embeddings
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    files = safetensors_files(model_dir)
    found = {k: v for k, v in checkpoint_shapes(files).items()
             if not k.endswith("rotary_emb.inv_freq") and not (tied and k == "lm_head.weight")}
    contradiction = _contradicted_field(cfg, found)
    if contradiction:
        raise SpecopsError(f"{config_path} says {contradiction}")
    check_shapes(found, expected, str(config_path))
    state = load_safetensors(files)
    model.load_state_dict({k: state[k].to(dtype) for k in found}, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    if lora is not None:
        # Merged in float64, rounded once to the compute dtype: the weights a merged checkpoint would carry.
        apply_lora(model, read_lora(Path(lora)), lora_mode, dtype)
    return model.to(device).eval(), raw


def _contradicted_field(cfg: LlamaConfig, found: dict) -> str | None:
    """The config.json size that the weights contradict, read off the tensors every checkpoint of the family has,
    so that the error says which number is wrong rather than which tensor it first breaks."""
    shape, path = found.get("model.embed_tokens.weight", ((), None))
    if len(shape) == 2:
        sizes = (("vocab_size", cfg.vocab_size, shape[0]), ("hidden_size", cfg.hidden_size, shape[-1]))
        for name, value, actual in sizes:
            if value != actual:
                return f"{name} {value}, but {path} holds {actual} (model.embed_tokens.weight is {shape})"
    layers = {int(k.split(".")[2]): p for k, (_, p) in found.items()
              if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if layers and max(layers) + 1 != cfg.num_hidden_layers:
        return f"num_hidden_layers {cfg.num_hidden_layers}, but {layers[max(layers)]} holds {max(layers) + 1} layers"
    return None


def load_tokenizer(model_dir: str | Path, vocab_size: int):
    """The model's HF tokenizer, refused if it can emit an id the model has no embedding row for."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as e:
        raise SpecopsError(f"{model_dir}: cannot load tokenizer ({str(e).splitlines()[0]})") from None
    source = model_dir / "tokenizer.json"
    source = source if source.is_file() else f"the tokenizer in {model_dir}"
    limit = f"the model's vocabulary of {vocab_size} (vocab_size in config.json)"
    special = {t: i for t, i in zip(tok.all_special_tokens, tok.all_special_ids)
               if i is None or not 0 <= i < vocab_size}
    if special:
        raise SpecopsError(f"{source}: special token ids outside {limit}: {special}")
    top = max(tok.get_vocab().values(), default=-1)
    if top >= vocab_size:
        raise SpecopsError(f"{source} has {len(tok)} tokens with ids up to {top}, beyond {limit}")
    return tok


def eos_token_ids(model_dir: str | Path, model: LlamaForCausalLM, tokenizer) -> list[int]:
    """EOS ids as vLLM gathers them: the model config's, generation_config.json's, and the tokenizer's."""
    ids = set(model.config.eos_token_id)
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        e = read_json(gen).get("eos_token_id")
        ids |= {e} if isinstance(e, int) else set(e or [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def save_merged(model_dir: Path, lora_dir: Path, out_dir: Path) -> Path:
    """Write ``model_dir`` with ``lora_dir`` merged (float32 weights, same config and tokenizer) into ``out_dir``.

    vLLM's CPU build crashes when LoRA and an EAGLE-3 draft are used together; serving the merged weights avoids it
    and is what production does with a single fine-tune. The merge is the one ``load_target`` does, so the copy
    holds the weights the embedded engine computes with in merged mode.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    names = set(checkpoint_shapes(safetensors_files(model_dir)))
    model, _ = load_target(model_dir, lora=lora_dir, lora_mode="merged", dtype=torch.float32)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if k in names}
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out_dir / f.name)
    save_safetensors(state, out_dir / "model.safetensors")
    return out_dir
