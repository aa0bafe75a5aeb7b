"""Benchmark harness: async load against an OpenAI-compatible server, the γ × concurrency × temperature sweep,
serving metrics with SLO goodput, speculative acceptance, a crash-safe run store and a deployable recommendation."""

from specops.bench.config import SweepConfig
from specops.bench.sweep import run_bench, run_sweep

__all__ = ["SweepConfig", "run_bench", "run_sweep"]
