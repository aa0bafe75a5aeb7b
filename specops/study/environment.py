"""What a run was measured on: versions and hardware, stored with the run so every figure traces to them."""

from __future__ import annotations

import os
import platform
from importlib import metadata

PACKAGES = ("specops", "torch", "transformers", "peft", "triton", "xgrammar", "fastapi", "uvicorn", "numpy", "scipy")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict:
    import torch

    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu": _cpu(),
           "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    for name in PACKAGES:
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env[name] = None
    return env
