"""README.md of a trained draft: what it drafts for, what it was trained on, and what it measured."""

from __future__ import annotations

import json


def _acceptance_row(name: str, a: dict | None) -> str:
    if a is None:
        return f"| {name} | – | – |"
    return f"| {name} | {a['acceptance_rate']:.3f} | {a['mean_acceptance_length']:.3f} |"


def render(report: dict) -> str:
    t = report["training"]
    p = report["prompts"]
    acc = report["acceptance"]
    lora = f" with the LoRA adapter `{report['lora']}`" if report["lora"] else ""
    init = f"fine-tuned from `{report['init']}`" if report["init"] else "trained from a fresh initialisation"
    heldout = acc["after"]["prompts"] if acc["after"] else 0
    speculative = json.dumps({"method": "eagle3", "model": "THIS_DIR", "num_speculative_tokens": 3})
    # vLLM 0.32 (CPU) crashes in the draft step when a LoRA adapter and EAGLE-3 are served together.
    merged = ", in front of the target with the adapter merged into its weights" if report["lora"] else ""
    return f"""# EAGLE-3 draft

Draft head (vLLM `LlamaForCausalLMEagle3` layout, 1 layer, draft vocabulary of {report['draft_vocab_size']} tokens,
target taps at layers {report['aux_layers']}) for the target `{report['target']}`{lora}; {init}.

## Training

- Data: {p['source']}; {p['train']} training prompts answered again by the target itself
  ({report['data']['answer_tokens']} answer tokens, temperature {report['data']['temperature']},
  at most {report['data']['max_new_tokens']} new tokens), {p['heldout']} prompts held out.
- Training-time test over {t['ttt_steps']} chained steps (step losses weighted {t['decay']}^k), soft cross-entropy
  against the target's distribution over the draft vocabulary; {t['steps']} AdamW steps of {t['batch_size']}
  sequences ({t['epochs']} epochs), peak learning rate {t['lr']}, seed {t['seed']}.
- Per-step training accuracy over the last tenth of the steps (draft argmax = target argmax): {', '.join(f'{a:.3f}' for a in t['step_accuracy'])}.

## Acceptance on the {heldout} held-out prompts (greedy, γ = 3)

| draft | acceptance rate | mean acceptance length |
|---|---|---|
{_acceptance_row('before (the `--init` draft)' if report['init'] else 'before (none)', acc['before'])}
{_acceptance_row('after (this draft)', acc['after'])}

`train_report.json` holds every number above. Serve it with vLLM:
`--speculative-config '{speculative}'`{merged}.
"""
