"""OpenAI-compatible HTTP server over specops' engine (``run_server``; ``python -m specops.serve``)."""

from specops.serve.server import run_server

__all__ = ["run_server"]
