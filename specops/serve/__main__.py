"""``python -m specops.serve``: the server without the typer CLI (backends start it this way)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from specops.errors import SpecopsError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specops.serve", description="OpenAI-compatible server over specops' engine.")
    p.add_argument("--model", type=Path, required=True, help="Target model directory (Hugging Face layout).")
    p.add_argument("--lora", type=Path, default=None, help="peft LoRA adapter directory.")
    p.add_argument("--lora-mode", choices=["merged", "unmerged"], default="merged")
    p.add_argument("--draft", type=Path, default=None, help="EAGLE-3 draft directory (enables speculation).")
    p.add_argument("--gamma", type=int, default=3, help="Speculative tokens per step.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on /v1/*.")
    p.add_argument("--max-queue", type=int, default=256, help="Requests in flight before answering 429.")
    p.add_argument("--max-batch", type=int, default=16, help="Requests decoded together.")
    p.add_argument("--max-seq-len", type=int, default=1024, help="Prompt + completion tokens per request.")
    p.add_argument("--served-model-name", default=None, help="Name clients put in 'model' (default: --model).")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from specops.serve.server import run_server

    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        run_server(a.model, lora=a.lora, lora_mode=a.lora_mode, draft=a.draft, gamma=a.gamma, host=a.host,
                   port=a.port, api_key=a.api_key, max_queue=a.max_queue, max_batch=a.max_batch,
                   max_seq_len=a.max_seq_len, served_model_name=a.served_model_name, device=a.device)
    except SpecopsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
