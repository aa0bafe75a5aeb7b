"""Benchmark harness: async load against an OpenAI-compatible server, the γ × concurrency × temperature sweep,
serving metrics with SLO goodput, speculative acceptance, a crash-safe run store and a deployable recommendation."""
