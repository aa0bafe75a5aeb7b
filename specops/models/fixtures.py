"""The fixture recipe: a tiny Llama pretrained on the general mix, a LoRA fine-tune on the commerce task, the merge.

Weights cannot be downloaded, so the project trains its own models from data it generates. Three directories
come out, all Hugging Face layout with bf16 safetensors:

- ``base/``: ``LlamaForCausalLM`` + byte-level BPE tokenizer + chat template, pretrained on ``corpus``;
- ``lora/``: a peft LoRA adapter on every linear layer of ``base``, fine-tuned on the task's synthetic data;
- ``target-merged/``: ``base`` with the adapter merged, which is the task model the engines serve.

The shape suits real vLLM's CPU build (head_dim 32, 8 layers so EAGLE-3's taps 2, N//2, N-3 are distinct, untied
embeddings). Everything is seeded and runs with deterministic algorithms on a fixed thread count, tensors are
written with sorted keys and JSON with sorted keys, so rebuilding on one machine gives byte-identical files.
The LoRA stage trains on the bf16-rounded base and the merge uses the bf16-rounded adapter: the files on disk
are exactly what was trained and measured.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from specops.models import corpus
from specops.models import tokenizer as tok_lib
from specops.models.tokenizer import write_json

THREADS = 2
HELDOUT_SEED = 1_000_003  # held-out queries for quality checks; training queries never repeat one of them
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SUBDIRS = ("base", "lora", "target-merged")


@dataclass(frozen=True)
class Recipe:
    """Model shape and training budget (the full build; ``QUICK`` scales the budget down, not the shape)."""

    vocab_size: int = 3072
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    max_positions: int = 1024
    corpus_docs: int = 40_000
    tokenizer_docs: int = 12_000
    seq_len: int = 256
    pretrain_steps: int = 400
    pretrain_batch: int = 16
    pretrain_lr: float = 3e-3
    lora_rank: int = 64
    lora_alpha: int = 128
    train_examples: int = 12_000
    lora_steps: int = 1800
    lora_batch: int = 16
    lora_lr: float = 3e-3
    eval_examples: int = 100
    max_new_tokens: int = 192


FULL = Recipe()
QUICK = replace(FULL, corpus_docs=1_500, tokenizer_docs=1_500, pretrain_steps=3, pretrain_batch=4, train_examples=64,
                lora_steps=3, lora_batch=4, eval_examples=4, max_new_tokens=16)

Progress = Callable[[str, int, int, float], None]  # (stage, step, total, loss)


def setup_determinism(seed: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)


def lr_at(step: int, total: int, peak: float) -> float:
    """Linear warm-up over 5 % of the steps, then cosine decay to 10 % of the peak."""
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_loop(model, params, loss_at: Callable[[int], torch.Tensor], steps: int, peak_lr: float, stage: str,
               progress: Progress) -> float:
    """AdamW with warm-up + cosine and grad clipping over ``loss_at(step)``; returns the last loss."""
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        loss = loss_at(step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        progress(stage, step + 1, steps, loss_value)
    model.eval()
    return loss_value


def round_bf16_(module: torch.nn.Module) -> None:
    """Round every parameter to bf16 in place (kept fp32), so training continues from what is saved."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


def model_config(recipe: Recipe, tok):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id(tok_lib.BOS),
        eos_token_id=tok.token_to_id(tok_lib.EOT),
        pad_token_id=tok.token_to_id(tok_lib.PAD),
        architectures=["LlamaForCausalLM"],
        dtype="bfloat16",
    )


def pretrain(recipe: Recipe, tok, docs: list[str], seed: int, progress: Progress):
    """Next-token training on packed documents of the general mix."""
    from transformers import LlamaForCausalLM

    stream = [i for ids in (e.ids for e in tok.encode_batch(docs, add_special_tokens=False)) for i in ids]
    n_blocks = len(stream) // recipe.seq_len
    blocks = torch.tensor(stream[: n_blocks * recipe.seq_len]).view(n_blocks, recipe.seq_len)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(model_config(recipe, tok))
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_blocks, generator=gen, device="cpu").to(blocks.device)

    def loss_at(step: int) -> torch.Tensor:
        x = blocks[order[(torch.arange(recipe.pretrain_batch) + step * recipe.pretrain_batch) % n_blocks]]
        return model(input_ids=x, labels=x).loss

    train_loop(model, list(model.parameters()), loss_at, recipe.pretrain_steps, recipe.pretrain_lr, "pretrain", progress)
    round_bf16_(model)
    return model


def task_examples(recipe: Recipe, seed: int):
    """Training examples for the LoRA stage and the held-out set, disjoint by query text."""
    from specops.task import synth

    heldout = heldout_examples(recipe.eval_examples)
    seen = {e.query.casefold() for e in heldout}
    train = [e for e in synth.generate(recipe.train_examples, seed=seed + 1) if e.query.casefold() not in seen]
    return train, heldout


def heldout_examples(n: int):
    from specops.task import synth

    return synth.generate(n, seed=HELDOUT_SEED)


def encode_example(hf_tok, example) -> tuple[list[int], list[int]]:
    """Prompt ids as every engine renders them, and answer ids (canonical JSON then ``<|eot|>``)."""
    from specops.task import prompt

    prompt_ids = list(hf_tok.apply_chat_template(prompt.messages(example.query), add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))
    answer_ids = hf_tok(prompt.format_answer(example.gold), add_special_tokens=False)["input_ids"]
    return prompt_ids, answer_ids + [hf_tok.eos_token_id]


def common_prefix(seqs: list[list[int]]) -> int:
    n = min(map(len, seqs))
    first = seqs[0]
    for seq in seqs:
        n = next((i for i in range(n) if seq[i] != first[i]), n)
    return n


def finetune_lora(recipe: Recipe, base, hf_tok, examples, seed: int, progress: Progress):
    """LoRA on every linear layer, loss on the answer tokens only.

    Every prompt starts with the same system turn, so each step runs that shared prefix once and lets all rows
    of the batch attend to its keys and values (gradients flow through them): the same loss as running every
    row in full, at well under the cost, since the system prompt is most of a prompt.
    """
    from peft import LoraConfig, get_peft_model

    encoded = [encode_example(hf_tok, e) for e in examples]
    shared = common_prefix([p for p, _ in encoded])
    prefix = torch.tensor([encoded[0][0][:shared]])
    rows_all = [(p[shared:], a) for p, a in encoded]
    lora_cfg = LoraConfig(r=recipe.lora_rank, lora_alpha=recipe.lora_alpha, lora_dropout=0.0, bias="none",
                          target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    torch.manual_seed(seed)
    model = get_peft_model(base, lora_cfg)
    order = list(range(len(rows_all)))
    random.Random(seed).shuffle(order)

    def loss_at(step: int) -> torch.Tensor:
        rows = [rows_all[order[(step * recipe.lora_batch + j) % len(order)]] for j in range(recipe.lora_batch)]
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((len(rows), width), hf_tok.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for r, (p, a) in enumerate(rows):
            n = len(p) + len(a)
            ids[r, :n] = torch.tensor(p + a)
            labels[r, len(p):n] = torch.tensor(a)
            mask[r, shared:shared + n] = 1
        cache = model(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(rows))
        positions = torch.arange(shared, shared + width).expand(len(rows), -1)
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                     labels=labels).loss

    params = [p for p in model.parameters() if p.requires_grad]
    train_loop(model, params, loss_at, recipe.lora_steps, recipe.lora_lr, "lora", progress)
    with torch.no_grad():
        for p in params:
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return model


def save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """bf16 safetensors with sorted keys and fixed metadata (no timestamps), so rebuilds are byte-identical."""
    from specops.models.target import save_safetensors

    save_safetensors({k: v.detach().to(torch.bfloat16).contiguous() for k, v in tensors.items()}, path)


def save_model(model, tok, recipe: Recipe, out: Path) -> None:
    from transformers import GenerationConfig

    out.mkdir(parents=True)
    cfg = model.config.to_dict()
    cfg.pop("_name_or_path", None)
    write_json(out / "config.json", cfg)
    gen = GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
                           pad_token_id=model.config.pad_token_id, do_sample=False)
    write_json(out / "generation_config.json", gen.to_diff_dict())
    save_weights(model.state_dict(), out / "model.safetensors")
    tok_lib.save(tok, out, recipe.max_positions)


def save_adapter(peft_model, out: Path) -> None:
    """adapter_config.json + adapter_model.safetensors; the base is named relative to the adapter directory."""
    from peft import get_peft_model_state_dict

    out.mkdir(parents=True)
    cfg = peft_model.peft_config["default"].to_dict()
    cfg["base_model_name_or_path"] = "../base"
    cfg["target_modules"] = sorted(cfg["target_modules"])
    write_json(out / "adapter_config.json", {k: sorted(v) if isinstance(v, set) else v for k, v in cfg.items()})
    save_weights(get_peft_model_state_dict(peft_model), out / "adapter_model.safetensors")


@torch.no_grad()
def greedy_answers(model, hf_tok, queries: list[str], max_new_tokens: int, batch_size: int = 50) -> list[str]:
    """Greedy completions of task prompts, batched with left padding."""
    from specops.task import prompt

    texts = []
    for i in range(0, len(queries), batch_size):
        rows = [list(hf_tok.apply_chat_template(prompt.messages(q), add_generation_prompt=True, tokenize=True,
                                                return_dict=False)) for q in queries[i:i + batch_size]]
        width = max(map(len, rows))
        ids = torch.tensor([[hf_tok.pad_token_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id)
        texts += hf_tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts


def evaluate(model, hf_tok, examples, max_new_tokens: int):
    """Task metrics of greedy answers on ``examples``."""
    from specops.task import metrics

    texts = greedy_answers(model, hf_tok, [e.query for e in examples], max_new_tokens)
    return metrics.score(texts, [e.gold for e in examples])


def quality(report) -> dict:
    return {"valid_rate": report.valid_rate, "field_accuracy": report.field_accuracy,
            "exact_match": report.exact_match, "per_field": report.per_field}


def load_model(path: Path):
    """A fixture model directory in fp32 (the dtype it was trained and measured in)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def build(out: Path, quick: bool = False, seed: int = 0, progress: Progress | None = None) -> dict:
    """Build base/, lora/, target-merged/ and the two EAGLE-3 drafts into ``out``; returns sizes and quality.

    Everything is written into a temporary sibling directory first and each finished directory is moved into
    place at the end, so an interrupted build never leaves a directory that looks complete.
    """
    from transformers import AutoTokenizer

    progress = progress or (lambda *_: None)
    recipe = QUICK if quick else FULL
    setup_determinism(seed)
    t0 = time.monotonic()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()

    docs = corpus.documents(recipe.corpus_docs, seed=seed)
    tok = tok_lib.train(docs[: recipe.tokenizer_docs], recipe.vocab_size)
    base = pretrain(recipe, tok, docs, seed, progress)
    save_model(base, tok, recipe, tmp / "base")
    hf_tok = AutoTokenizer.from_pretrained(str(tmp / "base"))

    train, heldout = task_examples(recipe, seed)
    peft_model = finetune_lora(recipe, base, hf_tok, train, seed, progress)
    save_adapter(peft_model, tmp / "lora")
    lora_parameters = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    merged = peft_model.merge_and_unload()
    save_model(merged, tok, recipe, tmp / "target-merged")

    target_report = evaluate(load_model(tmp / "target-merged"), hf_tok, heldout, recipe.max_new_tokens)
    base_report = evaluate(load_model(tmp / "base"), hf_tok, heldout, recipe.max_new_tokens)
    summary = {
        "recipe": "quick" if quick else "full",
        "seed": seed,
        "vocab_size": tok.get_vocab_size(),
        "parameters": sum(p.numel() for p in merged.parameters()),
        "lora_parameters": lora_parameters,
        "heldout": len(heldout),
        "target": quality(target_report),
        "base": quality(base_report),
    }
    for name in SUBDIRS:
        dest = out / name
        out.mkdir(exist_ok=True)
        if dest.is_dir():
            shutil.rmtree(dest)
        (tmp / name).rename(dest)
    shutil.rmtree(tmp)
    from specops.training.fixtures import build_drafts  # the drafts are trained on the models just written

    drafts = build_drafts(out, quick=quick, seed=seed, progress=progress)
    summary["drafts"] = {name: report["acceptance"] for name, report in drafts.items()}
    write_json(out / "build.json", summary)  # last, with the drafts: its presence marks a finished build
    write_readme(out, summary, recipe, quick)
    return {**summary, "seconds": round(time.monotonic() - t0, 1)}


def write_readme(root: Path, summary: dict, recipe: Recipe, quick: bool) -> None:
    """README.md of a fixture set: what each directory is, the command that made it, sizes, measured quality."""
    command = "specops fixtures build" + (" --quick" if quick else "") + (f" --seed {summary['seed']}" if summary["seed"] else "")
    sizes = "\n".join(
        f"| `{d}/{f.name}` | {f.stat().st_size / 1e6:.2f} MB |"
        for d in SUBDIRS for f in sorted((root / d).iterdir()) if f.suffix == ".safetensors"
    )
    t, b, drafts = summary["target"], summary["base"], summary["drafts"]
    rows = "\n".join(f"| `{name}/` | {a['after']['acceptance_rate']:.3f} | {a['after']['mean_acceptance_length']:.2f} |"
                     for name, a in drafts.items())
    text = f"""# commerce-tiny fixture models

Tiny models trained from the project's own synthetic data (nothing downloaded), small enough for CPU tests and
shaped so that real vLLM's CPU build serves them with an EAGLE-3 draft.

| directory | what it is |
|---|---|
| `base/` | `LlamaForCausalLM` ({summary['parameters'] / 1e6:.2f} M parameters, {recipe.num_layers} layers, hidden {recipe.hidden_size}, {recipe.num_heads} heads / {recipe.num_kv_heads} KV heads of dim {recipe.head_dim}, untied embeddings) with its own byte-level BPE tokenizer ({summary['vocab_size']} tokens) and chat template, pretrained for {recipe.pretrain_steps} steps on a general synthetic mix (product copy, reviews, chit-chat, generic JSON; English and Traditional Chinese). It is not the task model. |
| `lora/` | peft LoRA adapter (rank {recipe.lora_rank}, alpha {recipe.lora_alpha}, all linear layers, {summary['lora_parameters'] / 1e6:.2f} M parameters) fine-tuned for {recipe.lora_steps} steps on synthetic commerce queries; `base_model_name_or_path` is `../base`, relative to this directory. |
| `target-merged/` | `base` with the adapter merged (peft `merge_and_unload`), tokenizer files included: the task model. |
| `draft-general/` | EAGLE-3 draft (vLLM's `LlamaForCausalLMEagle3` layout) trained on the **base** model's answers to general prompts: the stand-in for a published draft that never saw the fine-tuned target. |
| `draft-domain/` | `draft-general` fine-tuned on the **LoRA target's** answers to synthetic commerce queries (none held out). Each draft directory has its `train_report.json`. |

Chat template: `<|bos|>`, then `<|role|>\\n{{content}}<|eot|>\\n` per message, then `<|assistant|>\\n`. The answer is the
canonical JSON followed by `<|eot|>` (the EOS id in `config.json` and `generation_config.json`).

## How it was made

```
{command}
```

Seeded, deterministic algorithms, {THREADS} threads: rebuilding on the same machine gives byte-identical files.
Weights are bf16; `build.json` holds the numbers below.

| file | size |
|---|---|
{sizes}

## Measured quality

Greedy decoding of {summary['heldout']} held-out synthetic queries (never seen in training), scored by the task metrics:

| model | schema-valid rate | field accuracy | exact match |
|---|---|---|---|
| `target-merged/` | {t['valid_rate']:.3f} | {t['field_accuracy']:.3f} | {t['exact_match']:.3f} |
| `base/` | {b['valid_rate']:.3f} | {b['field_accuracy']:.3f} | {b['exact_match']:.3f} |

Per-field accuracy of `target-merged/`: {", ".join(f"{k} {v:.2f}" for k, v in t["per_field"].items())}.

Each draft in front of the model it was trained for, greedy, γ = {drafts["draft-domain"]["after"]["gamma"]}, on its own held-out prompts
(`train_report.json`: `draft-general/` with `base/` on general prompts, `draft-domain/` with `target-merged/` on
commerce queries):

| draft | acceptance rate | mean acceptance length |
|---|---|---|
{rows}
"""
    (root / "README.md").write_text(text, encoding="utf-8")
