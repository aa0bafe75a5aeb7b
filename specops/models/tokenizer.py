"""Byte-level BPE tokenizer and chat template of the fixture models.

Byte-level so any UTF-8 text (Traditional Chinese included) round-trips; digits are split one per token so
numbers are copied digit by digit. The chat template is the one convention every engine renders identically:
``<|bos|>`` then ``<|role|>\\n{content}<|eot|>\\n`` per message, and ``<|assistant|>\\n`` as generation prompt.
Raw text gets ``<|bos|>`` from the post-processor; the template writes its own, and transformers renders chat
templates without adding special tokens again, so chat prompts carry exactly one BOS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOT = "<|pad|>", "<|bos|>", "<|eot|>"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = [PAD, BOS, EOT, *ROLES]

CHAT_TEMPLATE = (
    "{{- '<|bos|>' -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|eot|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def train(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train the BPE on ``texts`` (special tokens take ids 0..5 in ``SPECIAL_TOKENS`` order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def write_json(path: Path, obj: dict) -> None:
    """Stable JSON on disk (sorted keys, UTF-8, trailing newline) so rebuilds are byte-identical."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def save(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json (chat template inside) and special_tokens_map.json.

    The config is written by hand rather than by ``save_pretrained`` so that it loads as a plain
    ``PreTrainedTokenizerFast`` under transformers 4.x (real vLLM) and 5.x alike.
    """
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    special = {"bos_token": BOS, "eos_token": EOT, "pad_token": PAD, "additional_special_tokens": list(ROLES)}
    write_json(out / "special_tokens_map.json", special)
    write_json(out / "tokenizer_config.json", {
        **special,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
