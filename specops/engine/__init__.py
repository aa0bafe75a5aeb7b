"""Inference engine: static KV cache, batched sampling, EAGLE-3 drafting and lossless verification.

Names resolve lazily so the model code can import ``specops.engine.kv_cache`` without pulling in the engine.
"""

from importlib import import_module

_EXPORTS = {
    "Engine": "specops.engine.engine",
    "Output": "specops.engine.engine",
    "StepOutput": "specops.engine.engine",
    "SamplingParams": "specops.engine.sampling",
    "SpecStats": "specops.engine.stats",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specops.engine' has no attribute {name!r}")
