"""Run real vLLM offline on token-id prompts and write outputs, spec-decode counters and timings as JSON.

Standalone on purpose: it runs under the vLLM environment's python (its own torch and transformers), so it
imports nothing from specops. The specops side builds the request file and reads the result
(``specops.peers.vllm.offline``).

Request file::

    {"model": DIR, "draft": DIR | null, "num_speculative_tokens": 3, "max_num_seqs": 16,
     "max_model_len": 1024, "dtype": "float32", "gpu_memory_utilization": 0.3, "enforce_eager": true,
     "runs": [{"name": "c4", "prompts": [[1, 2, 3], ...], "batch_size": 4, "temperature": 0.0,
               "top_p": 1.0, "top_k": 0, "max_tokens": 64, "seed": 0, "ignore_eos": false,
               "stop": [], "stop_token_ids": []}]}

One engine serves every run, so its start-up (about a minute on CPU) is paid once. ``batch_size`` caps how
many requests are in flight: prompts go to ``LLM.generate`` in chunks of that size (default: all at once,
bounded by ``max_num_seqs``). Spec-decode counters are cumulative in vLLM, so each run reports the
difference between snapshots taken around it; a warm-up is simply a run the caller ignores.

Result file::

    {"vllm_version": "0.32.0", "startup_s": 61.2,
     "runs": [{"name": "c4", "wall_s": 3.1, "num_output_tokens": 512, "output_tokens_per_s": 165.2,
               "outputs": [{"token_ids": [...], "text": "...", "finish_reason": "length"}],
               "spec": {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                        "accepted_per_pos": []}}]}
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_snapshot(llm) -> dict:
    """Spec-decode counters summed over label sets (one per engine core)."""
    from vllm.v1.metrics.reader import Counter, Vector

    snap = {key: 0 for key in SPEC_COUNTERS.values()}
    snap["accepted_per_pos"] = []
    for m in llm.get_metrics():
        if isinstance(m, Counter) and m.name in SPEC_COUNTERS:
            snap[SPEC_COUNTERS[m.name]] += m.value
        elif isinstance(m, Vector) and m.name == SPEC_PER_POS:
            pos = snap["accepted_per_pos"]
            pos += [0] * (len(m.values) - len(pos))
            for i, v in enumerate(m.values):
                pos[i] += v
    return snap


def spec_delta(after: dict, before: dict) -> dict:
    delta = {key: after[key] - before[key] for key in SPEC_COUNTERS.values()}
    prev = before["accepted_per_pos"] + [0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
    delta["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], prev)]
    return delta


def build_llm(req: dict):
    from vllm import LLM

    kwargs = dict(
        model=req["model"],
        tokenizer=req.get("tokenizer") or req["model"],
        dtype=req.get("dtype", "float32"),
        max_model_len=req.get("max_model_len"),  # None: the model's max_position_embeddings
        max_num_seqs=req.get("max_num_seqs", 16),
        gpu_memory_utilization=req.get("gpu_memory_utilization", 0.3),
        enforce_eager=req.get("enforce_eager", True),
        seed=req.get("seed", 0),
        disable_log_stats=False,  # get_metrics() needs the stat loggers
    )
    if req.get("draft") and req.get("num_speculative_tokens", 0) > 0:
        kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": req["draft"],
            "num_speculative_tokens": req["num_speculative_tokens"],
        }
    return LLM(**kwargs)


def sampling_params(run: dict):
    from vllm import SamplingParams

    return SamplingParams(
        temperature=run.get("temperature", 0.0),
        top_p=run.get("top_p", 1.0),
        top_k=run.get("top_k", 0) or -1,
        max_tokens=run.get("max_tokens", 64),
        seed=run.get("seed"),
        ignore_eos=run.get("ignore_eos", False),
        stop=run.get("stop") or None,
        stop_token_ids=run.get("stop_token_ids") or None,
    )


def execute(llm, run: dict) -> dict:
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in run["prompts"]]
    params = sampling_params(run)
    size = run.get("batch_size") or len(prompts)
    before = spec_snapshot(llm)
    start = time.perf_counter()
    results = []
    for i in range(0, len(prompts), size):
        results += llm.generate(prompts[i : i + size], params, use_tqdm=False)
    wall = time.perf_counter() - start
    outputs = [
        {"token_ids": list(r.outputs[0].token_ids), "text": r.outputs[0].text, "finish_reason": r.outputs[0].finish_reason}
        for r in results
    ]
    n_tokens = sum(len(o["token_ids"]) for o in outputs)
    return {
        "name": run.get("name", ""),
        "wall_s": wall,
        "num_output_tokens": n_tokens,
        "output_tokens_per_s": n_tokens / wall if wall > 0 else 0.0,
        "outputs": outputs,
        "spec": spec_delta(spec_snapshot(llm), before),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--request", type=Path, required=True)
    ap.add_argument("--result", type=Path, required=True)
    args = ap.parse_args()
    req = json.loads(args.request.read_text(encoding="utf-8"))

    import vllm

    start = time.perf_counter()
    llm = build_llm(req)
    startup = time.perf_counter() - start
    runs = [execute(llm, run) for run in req["runs"]]
    result = {"vllm_version": vllm.__version__, "startup_s": startup, "runs": runs}
    args.result.write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
