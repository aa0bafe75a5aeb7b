"""A target model from a local Hugging Face directory (optionally with a LoRA adapter), its tokenizer and EOS ids,
and a merged copy of target + adapter for servers that cannot combine an adapter with EAGLE-3."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from specops.errors import SpecopsError
from specops.files import load_safetensors_dir, read_json, save_safetensors
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
    names = set(load_safetensors_dir(model_dir))
    model, _ = load_target(model_dir, lora=lora_dir, lora_mode="merged", dtype=torch.float32)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if k in names}
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out_dir / f.name)
    save_safetensors(state, out_dir / "model.safetensors")
    return out_dir
