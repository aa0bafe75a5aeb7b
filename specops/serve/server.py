"""Load the engine and serve it over HTTP until SIGTERM/SIGINT, then drain in-flight requests and exit."""

from __future__ import annotations

import gc
import logging
import re
import signal
import sys
from typing import Optional

from specops.errors import SpecopsError

log = logging.getLogger("specops.serve")

API_KEY = re.compile(r"[!-~]+")  # visible ASCII: a header carries it exactly as given (HTTP trims whitespace)


def settle_heap() -> None:
    """Move everything loaded so far (torch, the model, the tokenizer, the app: some 400 k objects) out of the
    garbage collector's reach. Otherwise every few hundred requests a full collection walks them all while holding
    the GIL, and the engine and every stream stop for it (about 0.2 s); vLLM freezes its heap after start-up too."""
    gc.collect()
    gc.freeze()


def build_state(runner, *, model_name: str, max_seq_len: int, max_queue: int):
    """Server state over an engine runner (``EngineRunner`` or ``EngineProcess``; the app starts it on its event
    loop)."""
    from specops.serve.app import ServerState
    from specops.serve.prometheus import ServerMetrics

    metrics = ServerMetrics(model_name, lambda: runner.stats)
    return ServerState(runner=runner, model_name=model_name, max_seq_len=max_seq_len, max_queue=max_queue,
                       metrics=metrics)


def run_server(
    cfg,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: Optional[str] = None,
    max_queue: int = 256,
    served_model_name: Optional[str] = None,
    engine_process: Optional[bool] = None,
) -> None:
    """Serve what ``cfg`` (an EngineConfig) names on host:port; blocks until shut down.

    The served name defaults to the model path as given, as vLLM names it, so the same request body works on both.
    ``engine_process``: run the engine in a process of its own (default: on CUDA) rather than on a thread here.
    """
    import uvicorn

    from specops.serve.app import create_app

    if max_queue < 1:
        raise SpecopsError("--max-queue must be at least 1")
    if api_key is not None and not API_KEY.fullmatch(api_key):
        # Refused rather than served: no client could ever match such a key (and an empty one once meant no auth).
        raise SpecopsError("--api-key must be visible ASCII characters, without spaces")
    if engine_process is None:
        engine_process = cfg.device.startswith("cuda")
    if engine_process:
        from specops.serve.engine_process import EngineProcess

        runner = EngineProcess(cfg)
    else:
        from specops.engine.engine import Engine
        from specops.serve.runner import EngineRunner

        runner = EngineRunner(Engine.from_config(cfg))
    state = build_state(runner, model_name=served_model_name or str(cfg.model), max_seq_len=cfg.max_seq_len,
                        max_queue=max_queue)
    app = create_app(state, api_key=api_key)
    settle_heap()
    log.info("serving %s on http://%s:%d/v1", state.model_name, host, port)
    # uvicorn handles SIGTERM/SIGINT: it stops accepting, waits for in-flight responses, runs shutdown, then
    # re-raises the signal with the previous handler; a drained SIGTERM is a normal exit, so that handler exits 0.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=None)
