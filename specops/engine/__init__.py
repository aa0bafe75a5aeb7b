"""Inference engine: scheduler, model runner, batched sampling, EAGLE-3 drafting and lossless verification.

Import from the modules: ``engine.engine.Engine``, ``engine.sampling.SamplingParams``, ``engine.stats.SpecStats``.
"""
