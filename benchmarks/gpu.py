"""The engine on a GPU, against the memory-bandwidth bound and transformers, in one run.

1. The card's copy bandwidth (device-to-device, bytes read + written), which sets the bound.
2. The fixture models on the GPU in float32: greedy γ = 3 with the domain draft must equal γ = 0 token for token.
3. A Llama-3.1-8B-shaped target with random bf16 weights (32 layers, hidden 4096, GQA 32/8, vocab 128256) and a
   draft shaped like a published Llama-3.1-8B EAGLE-3 draft (one layer, draft vocabulary 32000): tok/s per batch
   size for γ = 0 and γ = 3, each as a fraction of the bandwidth bound at that batch size (weights + the KV bytes a
   step reads), next to transformers ``generate`` on the same weights and shapes; the γ = 3 vs γ = 0 greedy match
   rate in bf16; the cost of a verify step (γ + 1 tokens) relative to a 1-token step and of a draft step
   relative to a target step (c), from CUDA-graph replays.

Writes ``gpu.json`` to ``$OUT`` (or ``--out``) and prints a table. ``--tiny`` runs every part on small shapes,
on the CPU too, to check the script itself.

    python benchmarks/gpu.py                 # on a machine with one CUDA GPU, about 5 minutes
    python benchmarks/gpu.py --tiny --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                rope_theta=500000.0, max_position_embeddings=131072,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192})
TINY = dict(LLAMA_8B, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="small shapes: a check of the script, not a measurement")
    ap.add_argument("--batches", default="1,8,32,64", help="batch sizes to time")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--hf-new-tokens", type=int, default=128, help="new tokens per transformers generate call")
    ap.add_argument("--skip", default="",
                    help="comma-separated parts to skip: fixtures,engine (the 8B-shaped model: every part after "
                         "fixtures),hf,steps,eager,profile,ablation,peaked")
    ap.add_argument("--out", type=Path, default=None, help="folder for gpu.json (default: $OUT, else .)")
    return ap.parse_args()


class Report:
    """Results by part; a part that fails records its traceback and the run goes on."""

    def __init__(self):
        self.data: dict = {"errors": {}}

    def part(self, name: str, fn, *args):
        t0 = time.perf_counter()
        try:
            self.data[name] = fn(*args)
        except Exception:  # noqa: BLE001 - one broken part must not cost the others' figures
            self.data["errors"][name] = traceback.format_exc()
            print(f"[{name}] FAILED\n{self.data['errors'][name]}", flush=True)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device) -> dict:
    """Device-to-device copy of 4 GiB, bytes read + written, median of 20 timed with device events."""
    import torch

    cuda = torch.device(device).type == "cuda"
    n = (1 << 31) if cuda else 1 << 22
    a = torch.randn(n // 2, device=device).view(torch.bfloat16)  # random bits, not zeros
    b = torch.empty_like(a)
    times = []
    for i in range(23):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            b.copy_(a)
            end.record()
            end.synchronize()
            dt = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            b.copy_(a)
            dt = time.perf_counter() - t0
        if i >= 3:
            times.append(dt)
    times.sort()
    moved = 2 * a.numel() * a.element_size()
    return {"bytes": moved, "tb_per_s": moved / times[10] / 1e12}


def fixture_check(device) -> dict:
    """Greedy γ = 3 (domain draft) vs γ = 0 on 32 held-out queries, float32, on ``device``; and γ = 3 with CUDA
    graphs (padded prefills and rounds) vs without (every step eager, unpadded)."""

    from specops.engine.engine import Engine
    from specops.engine.sampling import SamplingParams
    from specops.fixtures.recipe import heldout_examples
    from specops.inputs import query_prompt_ids

    root = REPO / "fixtures" / "commerce-tiny"
    plain = Engine.load(root / "target-merged", gamma=0, device=device, max_batch=32, max_seq_len=512)
    spec = Engine.load(root / "target-merged", draft=root / "draft-domain", gamma=3, device=device, max_batch=32,
                       max_seq_len=512)
    prompts = [query_prompt_ids(plain.tokenizer, e.query) for e in heldout_examples(32)]
    params = SamplingParams(temperature=0.0, max_tokens=192)
    out = {"fused": spec.runner.fused, "graphs": spec.runner.use_graphs}
    for name, batch in (("batch1", 1), ("batch32", 32)):
        rows = {}
        for label, eng in (("plain", plain), ("spec", spec)):
            eng.generate(prompts[:batch], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up / capture
            sync(device)
            t0 = time.perf_counter()
            outs = [o for i in range(0, len(prompts), batch) for o in eng.generate(prompts[i : i + batch], params)]
            sync(device)
            rows[label] = (outs, time.perf_counter() - t0)
        same = sum(a.token_ids == b.token_ids for a, b in zip(rows["plain"][0], rows["spec"][0]))
        tokens = sum(len(o.token_ids) for o in rows["plain"][0])
        out[name] = {"identical": same, "of": len(prompts), "plain_tok_s": tokens / rows["plain"][1],
                     "spec_tok_s": tokens / rows["spec"][1], "speedup": rows["plain"][1] / rows["spec"][1]}
    out["acceptance"] = spec.stats.to_dict(per_position=True)
    eager = Engine.load(root / "target-merged", draft=root / "draft-domain", gamma=3, device=device, max_batch=32,
                        max_seq_len=512, cuda_graphs=False)
    graphed = rows["spec"][0]  # batch 32, the last pass above
    unpadded = [o for i in range(0, len(prompts), 32) for o in eager.generate(prompts[i : i + 32], params)]
    out["graphs_vs_eager"] = {"identical": sum(a.token_ids == b.token_ids for a, b in zip(graphed, unpadded)),
                              "of": len(prompts)}
    return out


def build_models(shape: dict, device, dtype):
    """transformers' Llama with random weights, our engine model sharing them, and a random EAGLE-3 draft."""
    import torch
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM as HFLlama

    from specops.models.eagle3 import Eagle3Draft
    from specops.models.llama import LlamaConfig, LlamaForCausalLM, fuse_projections

    torch.manual_seed(0)
    hf_cfg = HFConfig(**shape, tie_word_embeddings=False, architectures=["LlamaForCausalLM"], bos_token_id=1,
                      eos_token_id=None, pad_token_id=0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in bf16 directly: no float32 copy of 8 B parameters
    try:
        with torch.device(device):
            hf = HFLlama(hf_cfg).eval()
    finally:
        torch.set_default_dtype(default)
    cfg = LlamaConfig.from_dict(hf_cfg.to_dict())
    with torch.device("meta"):
        ours = LlamaForCausalLM(cfg, 8)
    missing, _ = ours.load_state_dict({k: v for k, v in hf.state_dict().items() if "rotary" not in k}, assign=True,
                                      strict=False)
    if missing:
        raise RuntimeError(f"weights not shared with transformers' model: {missing[:4]}")
    ours.rotary = type(ours.rotary)(cfg, 8).to(device)
    ours = fuse_projections(ours.eval())
    draft = Eagle3Draft.random(cfg, draft_vocab_size=min(32000, cfg.vocab_size), seed=1)
    draft = fuse_projections(draft.attach(ours).eval())
    return hf, ours, draft, cfg


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every weight but the embedding table (of which it reads one row per token)."""
    emb = model.model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in model.parameters()) - emb.numel() * emb.element_size()


def kv_bytes_per_position(cfg, dtype_size: int) -> int:
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_size


def timed_generate(engine, prompts, new_tokens: int):
    """(prefill s, decode s, outputs): the first step admits every prompt; the rest are decode rounds."""
    from specops.engine.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    sync(engine.device)
    t0 = time.perf_counter()
    done = {}
    for so in engine.step():
        if so.finished:
            done[so.request_id] = so.output
    sync(engine.device)
    t1 = time.perf_counter()
    while engine.has_unfinished():
        for so in engine.step():
            if so.finished:
                done[so.request_id] = so.output
    sync(engine.device)
    return t1 - t0, time.perf_counter() - t1, [done[r] for r in ids]


def engine_runs(ours, draft, cfg, args, device, keep: dict) -> dict:
    """tok/s per batch size for γ = 0 and γ = 3 (and eager γ = 0 at the smallest batch), vs the bound."""
    import torch

    from specops.engine.engine import Engine

    batches = [int(b) for b in args.batches.split(",")]
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, cfg.vocab_size, (max(batches), args.prompt_len), generator=g).tolist()
    bw = REPORT.data.get("bandwidth", {}).get("tb_per_s")
    wbytes = weight_bytes(ours)
    kv_pos = kv_bytes_per_position(cfg, ours.lm_head.weight.element_size())
    engines = {0: Engine(ours, None, gamma=0, max_batch=max(batches), max_seq_len=args.max_seq_len, eos_token_ids=[]),
               3: Engine(ours, None, draft=draft, gamma=3, max_batch=max(batches), max_seq_len=args.max_seq_len,
                         eos_token_ids=[])}
    result = {"weight_bytes": wbytes, "kv_bytes_per_position": kv_pos, "fused": engines[0].runner.fused,
              "graphs": engines[0].runner.use_graphs, "rows": []}
    outputs = {}
    for b in batches:
        for gamma, eng in engines.items():
            timed_generate(eng, prompts[:b], 4)  # warm-up: Triton compiles, CUDA graphs captured for this bucket
            pre, dec, outs = timed_generate(eng, prompts[:b], args.new_tokens)
            outputs[(gamma, b)] = [o.token_ids for o in outs]
            tokens = sum(len(o.token_ids) for o in outs)
            decode_tokens = tokens - b  # the first token of each request comes from the prefill
            rounds = args.new_tokens - 1 if gamma == 0 else None
            # A decode step reads the weights once and each row's live context; the mean context over the decode.
            mean_ctx = args.prompt_len + args.new_tokens / 2
            step_bytes = wbytes + b * mean_ctx * kv_pos
            row = {"batch": b, "gamma": gamma, "prefill_s": pre, "decode_s": dec, "tokens": tokens,
                   "e2e_tok_s": tokens / (pre + dec), "decode_tok_s": decode_tokens / dec,
                   "step_bytes": step_bytes}
            if gamma:
                row["acceptance"] = eng.stats.to_dict()
            if bw:
                row["bound_tok_s"] = b * bw * 1e12 / step_bytes
                row["fraction_of_bound"] = row["decode_tok_s"] / row["bound_tok_s"]
            if rounds:
                row["ms_per_step"] = dec / rounds * 1e3
            result["rows"].append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                              if k != "acceptance"}), flush=True)
    result["match_rate_gamma3_vs_gamma0"] = {
        str(b): sum(a == c for a, c in zip(outputs[(0, b)], outputs[(3, b)])) / b for b in batches}
    if "eager" not in args.skip:
        eager = Engine(ours, None, gamma=0, max_batch=1, max_seq_len=args.max_seq_len, eos_token_ids=[],
                       cuda_graphs=False)
        timed_generate(eager, prompts[:1], 4)
        pre, dec, outs = timed_generate(eager, prompts[:1], min(args.new_tokens, 64))
        result["eager_batch1_decode_tok_s"] = (sum(len(o.token_ids) for o in outs) - 1) / dec
        del eager
    keep.update(engines)  # for the step costs
    return result


def hf_runs(hf, cfg, args, device) -> dict:
    """transformers ``generate`` (greedy, dynamic cache) on the same weights and shapes: new tokens/s."""
    import torch

    rows = []
    g = torch.Generator().manual_seed(0)
    for b in [int(x) for x in args.batches.split(",")]:
        ids = torch.randint(3, cfg.vocab_size, (b, args.prompt_len), generator=g).to(device)
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=4, **kw)
            sync(device)
            t0 = time.perf_counter()
            out = hf.generate(ids, max_new_tokens=args.hf_new_tokens, **kw)
            sync(device)
        dt = time.perf_counter() - t0
        rows.append({"batch": b, "tok_s": b * (out.shape[1] - args.prompt_len) / dt, "seconds": dt})
        print(json.dumps(rows[-1]), flush=True)
    return {"rows": rows}


def step_costs(ours, draft, cfg, device, engines: dict, ctx: int) -> dict:
    """Batch 1 at context ``ctx``, as CUDA-graph replays (eager on the CPU): a 1-token target forward, a 4-token
    verify forward, a 1-token draft step, and whole rounds at γ = 0 and γ = 3 (zero acceptance with a random
    draft)."""
    import torch

    from specops.engine.model_runner import Mode
    from specops.models import attention

    fused = engines[0].runner.fused
    cache0, cached = engines[0].runner.cache, engines[3].runner.proposer.cache
    slot = torch.tensor([0], device=device)
    cuda = torch.device(device).type == "cuda"

    def timer(fn, reps=50):
        if cuda:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        else:
            run = fn
        run()
        times = []
        for _ in range(5):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                run()
            sync(device)
            times.append((time.perf_counter() - t0) / reps)
        return sorted(times)[2] * 1e3

    def target_fwd(t):
        tokens = torch.randint(3, cfg.vocab_size, (1, t), device=device)
        positions = (torch.arange(t, device=device) + ctx).unsqueeze(0)
        return lambda: ours(tokens, cache0, attention.for_rows(fused, slot, positions))

    tok1 = torch.randint(3, cfg.vocab_size, (1, 1), device=device)
    hidden = torch.randn(1, draft.cfg.hidden_size, device=device, dtype=ours.lm_head.weight.dtype)
    pos1 = torch.tensor([[ctx]], device=device)
    draft_step = lambda: draft(tok1, hidden, cached, attention.for_rows(fused, slot, pos1), False)  # noqa: E731
    out = {"target_1_ms": timer(target_fwd(1)), "target_4_ms": timer(target_fwd(4)), "draft_step_ms": timer(draft_step)}
    out["verify_over_1_token"] = out["target_4_ms"] / out["target_1_ms"]
    out["c_draft_over_target"] = out["draft_step_ms"] / out["target_1_ms"]
    rounds = {}
    for gamma, eng in engines.items():
        r = eng.runner
        r.row_slots[:1] = 0

        def one_round(r=r):
            r.ctx_len[:1] = ctx  # same context every replay
            return r._round(1, Mode(), r.gamma, r.gamma)

        rounds[gamma] = timer(one_round, reps=30)
    out["round_gamma0_ms"], out["round_gamma3_ms"] = rounds[0], rounds[3]
    out["gamma3_over_gamma0_per_token_at_zero_acceptance"] = rounds[3] / rounds[0]
    return out


def profile(ours, engines: dict, device, ctx: int, out_dir: Path) -> dict:
    """Where a batch-1 decode step's device time goes: one eager 1-token forward over the fused path, per kernel."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from specops.models import attention

    runner = engines[0].runner
    slot = torch.tensor([0], device=device)
    tokens = torch.tensor([[5]], device=device)
    positions = torch.tensor([[ctx]], device=device)
    step = lambda: ours(tokens, runner.cache, attention.for_rows(runner.fused, slot, positions))  # noqa: E731
    for _ in range(3):
        step()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(5):
            step()
        sync(device)
    cuda = torch.device(device).type == "cuda"
    text = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=25)
    (out_dir / "profile.txt").write_text(text, encoding="utf-8")
    per_step = lambda e: (e.self_device_time_total if cuda else e.self_cpu_time_total) / 5  # noqa: E731
    rows = [{"name": e.key[:80], "calls_per_step": e.count / 5, "us_per_step": per_step(e)}
            for e in sorted(prof.key_averages(), key=per_step, reverse=True)[:15]]
    return {"top": rows}


def ablation(ours, draft, cfg, args, device) -> dict:
    """Batch-1 decode tok/s (γ = 0) with key-split attention and overlapped rounds each off and on, and the
    captured round alone (the rest of a synchronous step is host work)."""
    import torch

    from specops.engine.engine import Engine
    from specops.engine.model_runner import Mode
    from specops.models import kernels

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, cfg.vocab_size, (1, args.prompt_len), generator=g).tolist()
    saved = kernels.SPLIT_BELOW
    rows = []
    for split in (0, saved):
        for overlap in (False, True):
            kernels.SPLIT_BELOW = split
            eng = Engine(ours, None, gamma=0, max_batch=1, max_seq_len=args.max_seq_len, eos_token_ids=[],
                         overlap=overlap)
            timed_generate(eng, prompt, 4)
            pre, dec, outs = timed_generate(eng, prompt, args.new_tokens)
            row = {"split_attention": bool(split), "overlap": overlap,
                   "decode_tok_s": (len(outs[0].token_ids) - 1) / dec, "engine_step_ms": dec / (args.new_tokens - 1) * 1e3}
            if eng.runner.use_graphs:
                r = eng.runner
                r.row_slots[:1] = 0
                graph, _ = r._graphs[(1, Mode())]
                for _ in range(3):
                    graph.replay()
                sync(device)
                t0 = time.perf_counter()
                for _ in range(50):
                    r.ctx_len[:1] = args.prompt_len + args.new_tokens // 2
                    graph.replay()
                sync(device)
                row["round_replay_ms"] = (time.perf_counter() - t0) / 50 * 1e3
            rows.append(row)
            print(json.dumps(row), flush=True)
            del eng
    kernels.SPLIT_BELOW = saved
    return {"rows": rows}


def peaked_match(ours, draft, cfg, args, device) -> dict:
    """γ = 3 vs γ = 0 greedy agreement in bf16 with the LM head scaled up 8×, so that next-token distributions
    are peaked as a trained model's are rather than near-uniform over 128 k tokens (random weights)."""
    import torch

    from specops.engine.engine import Engine

    batches = [int(b) for b in args.batches.split(",")]
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(3, cfg.vocab_size, (max(batches), args.prompt_len), generator=g).tolist()
    w = ours.lm_head.weight
    w.mul_(8)
    try:
        engines = {k: Engine(ours, None, draft=draft if k else None, gamma=k, max_batch=max(batches),
                             max_seq_len=args.max_seq_len, eos_token_ids=[]) for k in (0, 3)}
        out = {}
        for b in batches:
            seqs = {k: [o.token_ids for o in timed_generate(e, prompts[:b], 64)[2]] for k, e in engines.items()}
            same = sum(a == c for a, c in zip(seqs[0], seqs[3]))
            first = [next((i for i, (x, y) in enumerate(zip(a, c)) if x != y), len(a)) for a, c in zip(seqs[0], seqs[3])]
            out[str(b)] = {"identical": same / b, "mean_first_difference": sum(first) / b}
        print(json.dumps(out), flush=True)
        return out
    finally:
        w.div_(8)


def table(data: dict) -> str:
    lines = []
    bw = data.get("bandwidth", {}).get("tb_per_s")
    if bw:
        lines.append(f"copy bandwidth {bw:.2f} TB/s")
    fx = data.get("fixtures")
    if fx:
        for k in ("batch1", "batch32"):
            r = fx[k]
            lines.append(f"fixtures fp32 {k}: γ=3 identical {r['identical']}/{r['of']}, {r['spec_tok_s']:.0f} vs "
                         f"{r['plain_tok_s']:.0f} tok/s ({r['speedup']:.2f}×)")
        if "graphs_vs_eager" in fx:
            lines.append(f"fixtures fp32 γ=3 CUDA graphs vs eager: identical {fx['graphs_vs_eager']['identical']}/"
                         f"{fx['graphs_vs_eager']['of']}")
    eng = data.get("engine")
    hf = {r["batch"]: r["tok_s"] for r in (data.get("hf") or {}).get("rows", [])}
    if eng:
        lines.append("| batch | γ | decode tok/s | bound tok/s | fraction | e2e tok/s | transformers tok/s | e2e / HF |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in eng["rows"]:
            h = hf.get(r["batch"])
            vs_hf = "–" if h is None else f"{r['e2e_tok_s'] / h:.2f}"
            hf_cell = "–" if h is None else f"{h:.1f}"
            lines.append(f"| {r['batch']} | {r['gamma']} | {r['decode_tok_s']:.1f} | {r.get('bound_tok_s', 0):.0f} | "
                         f"{r.get('fraction_of_bound', 0):.1%} | {r['e2e_tok_s']:.1f} | {hf_cell} | {vs_hf} |")
        lines.append(f"γ=3 vs γ=0 greedy match (bf16): {eng['match_rate_gamma3_vs_gamma0']}")
        if "eager_batch1_decode_tok_s" in eng:
            lines.append(f"eager (no CUDA graphs) batch 1: {eng['eager_batch1_decode_tok_s']:.1f} tok/s")
    st = data.get("steps")
    if st:
        lines.append(f"steps at batch 1: target 1 tok {st['target_1_ms']:.3f} ms, 4 tok {st['target_4_ms']:.3f} ms "
                     f"({st['verify_over_1_token']:.3f}×), draft step {st['draft_step_ms']:.3f} ms "
                     f"(c = {st['c_draft_over_target']:.3f}); round γ=0 {st['round_gamma0_ms']:.3f} ms, "
                     f"γ=3 {st['round_gamma3_ms']:.3f} ms ({st['gamma3_over_gamma0_per_token_at_zero_acceptance']:.2f}×)")
    return "\n".join(lines)


REPORT = Report()


def main() -> None:
    args = parse()
    import torch

    device = args.device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --tiny --device cpu to check the script")
    torch.backends.cuda.matmul.allow_tf32 = False
    skip = set(filter(None, args.skip.split(",")))
    if args.tiny:
        args.batches, args.prompt_len, args.new_tokens, args.hf_new_tokens = "1,4", 16, 12, 8
        args.max_seq_len = 64
    info = {"torch": torch.__version__, "python": platform.python_version(), "device": device,
            "gpu": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else platform.processor(),
            "shape": "tiny" if args.tiny else "llama-3.1-8b", "args": {k: str(v) for k, v in vars(args).items()}}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    REPORT.data["info"] = info
    print(json.dumps(info), flush=True)
    REPORT.part("bandwidth", copy_bandwidth, device)
    if "fixtures" not in skip:
        REPORT.part("fixtures", fixture_check, device)
    out_dir = args.out or Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    if "engine" not in skip:
        eight_b(args, device, skip, out_dir)
    (out_dir / "gpu.json").write_text(json.dumps(REPORT.data, indent=2, default=str) + "\n", encoding="utf-8")
    print(table(REPORT.data))
    print(f"wrote {out_dir / 'gpu.json'}")


def eight_b(args, device, skip: set, out_dir: Path) -> None:
    """Every part on the Llama-3.1-8B-shaped model."""
    import torch

    dtype = torch.bfloat16
    t0 = time.perf_counter()
    hf, ours, draft, cfg = build_models(TINY if args.tiny else LLAMA_8B, device, dtype)
    print(f"[build] {time.perf_counter() - t0:.1f} s, {weight_bytes(ours) / 1e9:.2f} GB of weights read per step",
          flush=True)
    engines: dict = {}
    ctx = args.prompt_len + args.new_tokens // 2
    with torch.inference_mode():
        REPORT.part("engine", engine_runs, ours, draft, cfg, args, device, engines)
        if "steps" not in skip and engines:
            REPORT.part("steps", step_costs, ours, draft, cfg, device, engines, ctx)
        if "profile" not in skip and engines:
            REPORT.part("profile", profile, ours, engines, device, ctx, out_dir)
        if "ablation" not in skip and engines:
            REPORT.part("ablation", ablation, ours, draft, cfg, args, device)
        if "peaked" not in skip:
            REPORT.part("peaked", peaked_match, ours, draft, cfg, args, device)
    engines.clear()
    if "hf" not in skip:
        REPORT.part("hf", hf_runs, hf, cfg, args, device)


if __name__ == "__main__":
    main()
