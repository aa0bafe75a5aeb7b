"""What a prefill costs when it fits no captured CUDA graph, the first time in a process and after.

The engine replays a captured prefill for any group of prompts within the largest captured shape (2,048 tokens);
a larger group runs eagerly, and the first eager prefill of a process compiles its kernels. This script loads the
engine three times in one process with an empty Triton cache (plain decoding, speculative, plain again) and times,
for each, a captured prefill of 8 prompts, then eager ones of 16 prompts (twice) and 20 prompts of other lengths
(prompts of about 195 tokens, the study's chat-templated queries). Prints a table and writes ``eager_prefill.json``.

    python benchmarks/eager_prefill.py          # one CUDA GPU, fixture models, under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "fixtures" / "commerce-tiny"
# (prompts, tokens each, what it shows)
PREFILLS = [(8, 195, "captured (8 prompts, about 1,560 tokens)"), (16, 195, "eager (16 prompts, about 3,100 tokens)"),
            (16, 195, "eager again, the same lengths"), (20, 201, "eager, 20 prompts of other lengths")]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=FIXTURE / "target-merged")
    ap.add_argument("--draft", type=Path, default=FIXTURE / "draft-domain")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", REPO / "benchmarks" / "results")))
    return ap.parse_args()


def main() -> int:
    args = parse()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-")  # as on a fresh machine
    import torch

    from specops.engine.engine import Engine
    from specops.engine.sampling import SamplingParams

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    rows = []
    for label, draft in (("plain", None), ("γ = 3", args.draft), ("plain, again", None)):
        t = time.perf_counter()
        eng = Engine.load(args.model, draft=draft, gamma=3, device=args.device, dtype=args.dtype, max_batch=64,
                          max_seq_len=1024)
        print(f"{label}: engine loaded and captured in {time.perf_counter() - t:.1f} s", flush=True)
        base = 0
        for n, length, what in PREFILLS:
            prompts = [[(7 * i + j) % 1000 + 10 for j in range(length + i % 3)] for i in range(n)]
            sync()
            t = time.perf_counter()
            eng.runner.prefill(list(range(base, base + n)), prompts,
                               [SamplingParams(temperature=0.0, max_tokens=8)] * n, None).read()
            sync()
            rows.append({"engine": label, "prefill": what, "prompts": n, "tokens": sum(map(len, prompts)),
                         "ms": (time.perf_counter() - t) * 1e3})
            base += n
        del eng
    print(f"\n{'engine':<14}{'prefill':<44}{'tokens':>8}{'ms':>10}")
    for r in rows:
        print(f"{r['engine']:<14}{r['prefill']:<44}{r['tokens']:>8}{r['ms']:>10.2f}")
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eager_prefill.json").write_text(json.dumps(
        {"command": "python " + " ".join(sys.argv), "device": name, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
