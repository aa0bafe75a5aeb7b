"""Load the engine and serve it over HTTP until SIGTERM/SIGINT, then drain in-flight requests and exit."""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
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
    """Server state over an engine runner (``EngineRunner`` or ``EngineClient``; the app starts it on its event
    loop)."""
    from specops.serve.app import ServerState
    from specops.serve.prometheus import ServerMetrics

    metrics = ServerMetrics(model_name, lambda: runner.stats, lambda: runner.outstanding)
    return ServerState(runner=runner, model_name=model_name, max_seq_len=max_seq_len, max_queue=max_queue,
                       metrics=metrics)


def listen(host: str, port: int, shared: bool = False) -> socket.socket:
    """A listening socket on host:port. ``shared``: the other API processes bind the same address too
    (SO_REUSEPORT), and the kernel spreads new connections over them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise SpecopsError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


@dataclass(frozen=True)
class ApiSettings:
    """What every API process serves with."""

    model_name: str
    max_seq_len: int
    max_queue: int  # this process's share
    api_key: Optional[str]
    gamma_endpoint: bool = False  # POST /admin/gamma-schedule


def _server(runner, api: ApiSettings):
    """The uvicorn server of the app over ``runner``, built and loaded (imports, routes, its protocol classes) and
    the heap settled after, all before it serves: a connection that arrives first waits for none of it."""
    import uvicorn

    from specops.serve.app import create_app

    state = build_state(runner, model_name=api.model_name, max_seq_len=api.max_seq_len, max_queue=api.max_queue)
    config = uvicorn.Config(create_app(state, api_key=api.api_key, gamma_endpoint=api.gamma_endpoint),
                            log_level="warning", timeout_graceful_shutdown=None)
    config.load()
    settle_heap()
    return uvicorn.Server(config)


def _serve(server, sock: socket.socket) -> None:
    """Run ``server`` (see ``_server``) on ``sock`` until SIGTERM/SIGINT, draining in-flight requests first."""
    # uvicorn (on uvloop and httptools when installed) handles SIGTERM/SIGINT: it stops accepting, waits for
    # in-flight responses, runs shutdown, then re-raises the signal with the previous handler. A drained SIGTERM or
    # Ctrl-C is a normal exit, so the SIGTERM handler exits 0 and the KeyboardInterrupt is swallowed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass


def _api_main(link, engine_info: tuple, api: ApiSettings, address: tuple, parent: int, ready, go) -> None:
    """An API process beyond the first: its own link to the engine and its own socket on the same address. It is
    ready once its app is built (connections the kernel gives it before then would wait for its imports), serves
    once the first process does (so that whoever sees the server answer can also stop it), and exits with that
    process, should it be killed outright."""
    import threading

    from specops.serve.engine_process import EngineClient

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="specops-parent-watch", daemon=True).start()
    server = _server(EngineClient(link, *engine_info), api)
    sock = listen(*address, shared=True)
    ready.release()
    go.wait()
    _serve(server, sock)


def _start_peers(engine, api: ApiSettings, address: tuple, timeout_s: float = 300.0):
    """API processes 1.. over the engine's other links, returned once each has built its app and listens
    (connections made before then would all land on the first process); they serve once ``Peers.go`` is set."""
    from specops.serve.engine_process import Peers

    ctx = mp.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    info = (engine.model, engine.vocab_size, engine.eos_token_ids)
    peers = tuple(ctx.Process(target=_api_main, args=(engine.links[i], info, api, address, os.getpid(), ready, go),
                              name=f"specops-api-{i}", daemon=True) for i in range(1, len(engine.links)))
    for p, (commands, events) in zip(peers, engine.links[1:]):
        p.start()
        commands.close()  # the child has its own copies: the engine must see the link close when that child exits
        events.close()
    deadline = time.monotonic() + timeout_s
    for _ in peers:
        while not ready.acquire(timeout=0.2):
            dead = [p.name for p in peers if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                for p in peers:
                    p.kill()
                raise SpecopsError(f"API process {dead[0]} exited while starting" if dead else
                                   "API processes did not start in time")
    return Peers(peers, go)


def run_server(
    cfg,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: Optional[str] = None,
    max_queue: int = 256,
    served_model_name: Optional[str] = None,
    engine_process: Optional[bool] = None,
    api_procs: int = 1,
    gamma_endpoint: bool = False,
) -> None:
    """Serve what ``cfg`` (an EngineConfig) names on host:port; blocks until shut down.

    The served name defaults to the model path as given, as vLLM names it, so the same request body works on both.
    ``engine_process``: run the engine in a process of its own (default: on CUDA, or with several API processes)
    rather than on a thread here. ``api_procs``: HTTP processes sharing the port and the one engine process (as
    vLLM's ``--api-server-count``), for when one process's parsing and streaming cannot keep up with the engine;
    ``max_queue`` is split evenly between them and /metrics adds up all of them. ``gamma_endpoint``: serve
    ``POST /admin/gamma-schedule``, which changes the γ table of the running engine (for measuring tables side by
    side on one server; behind the API key like every route but /health).
    """
    if max_queue < 1:
        raise SpecopsError("--max-queue must be at least 1")
    if api_procs < 1:
        raise SpecopsError("--api-procs must be at least 1")
    if api_key is not None and not API_KEY.fullmatch(api_key):
        # Refused rather than served: no client could ever match such a key (and an empty one once meant no auth).
        raise SpecopsError("--api-key must be visible ASCII characters, without spaces")
    if engine_process is None:
        engine_process = cfg.device.startswith("cuda") or api_procs > 1
    if api_procs > 1 and not engine_process:
        raise SpecopsError("--api-procs above 1 needs the engine in a process of its own (--engine-process)")
    if api_procs > 1 and port:  # a busy port fails here, rather than quietly sharing its connections with another
        listen(host, port).close()
    sock = listen(host, port, shared=api_procs > 1)
    address = (host, sock.getsockname()[1])
    api = ApiSettings(served_model_name or str(cfg.model), cfg.max_seq_len, -(-max_queue // api_procs), api_key,
                      gamma_endpoint)
    if not engine_process:
        from specops.engine.engine import Engine
        from specops.serve.runner import EngineRunner

        server = _server(EngineRunner(Engine.from_config(cfg)), api)
        log.info("serving %s on http://%s:%d/v1", api.model_name, *address)
        _serve(server, sock)
        return
    metrics_dir = None
    if api_procs > 1:  # each API process counts into files here, and /metrics reads them all
        metrics_dir = tempfile.mkdtemp(prefix="specops-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        from specops.serve.engine_process import EngineProcess

        engine = EngineProcess(cfg, links=api_procs)
        peers = _start_peers(engine, api, address)
        server = _server(engine.client(0, peers), api)
        log.info("serving %s on http://%s:%d/v1 with %d API process(es)", api.model_name, *address, api_procs)
        _serve(server, sock)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
