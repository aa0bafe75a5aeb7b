"""The engine in a process of its own, as vLLM's engine core and SGLang's scheduler run.

In one process the engine's host work (scheduling, staging inputs, reading results) and the event loop's (a chunk
per request and step, parsing, sockets) take turns on one interpreter lock, and at high concurrency that lock, not
the GPU, sets the pace. Here the engine process runs ``EngineCore`` alone; commands reach it on one pipe and each
step's events come back on another, read by a thread of the server that hands them to the event loop.

The child is spawned (CUDA cannot be forked), ignores SIGINT and SIGTERM (the server drains its requests first,
then sends it ``stop``) and exits when the server's end of the pipe closes, so it never outlives the server.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading

from specops.errors import SpecopsError
from specops.serve.runner import EngineCore, Runner

log = logging.getLogger("specops.serve")


class EngineProcess(Runner):
    """The engine of ``cfg`` (an EngineConfig) in a child process; returns once it is loaded, raises SpecopsError
    with the child's message when loading fails."""

    def __init__(self, cfg):
        from specops.engine.grammar import Grammars
        from specops.models.target import load_tokenizer

        super().__init__()
        ctx = mp.get_context("spawn")
        commands_out, commands_in = ctx.Pipe(duplex=False)
        events_out, events_in = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_main, args=(cfg, commands_out, events_in), name="specops-engine",
                                 daemon=True)
        self._proc.start()
        commands_out.close()
        events_in.close()
        self._commands, self._events = commands_in, events_out
        self._send_lock = threading.Lock()  # the event loop (add, abort) and shutdown (stop) both send
        self._stats = None
        try:
            msg = self._events.recv()
        except EOFError:
            self._proc.join(5)
            raise SpecopsError(f"the engine process exited while loading (exit code {self._proc.exitcode})") from None
        if msg[0] == "failed":
            self._proc.join(5)
            raise SpecopsError(msg[1])
        _, self.vocab_size, self.eos_token_ids = msg
        self.tokenizer = load_tokenizer(cfg.model, self.vocab_size)
        self.grammars = Grammars(self.tokenizer, self.vocab_size)
        self._reader = threading.Thread(target=self._read, name="specops-engine-events", daemon=True)

    @property
    def stats(self):
        from specops.engine.stats import SpecStats

        return self._stats if self._stats is not None else SpecStats()

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def start(self) -> None:
        self._reader.start()

    def _send(self, cmd: tuple) -> None:
        try:
            with self._send_lock:
                self._commands.send(cmd)
        except (OSError, ValueError):  # the engine is gone: the reader fails its requests
            pass

    def _read(self) -> None:
        while True:
            try:
                _, events, self._stats = self._events.recv()
            except (EOFError, OSError):
                break
            self._route(events)
        self._proc.join(5)
        if not self._stopping:
            log.error("the engine process exited (exit code %s)", self._proc.exitcode)
        self._fail_all(f"the engine process exited (exit code {self._proc.exitcode})")

    def _close(self, timeout_s: float) -> None:
        self._reader.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._commands.close()


def _main(cfg, commands, events) -> None:
    """The child: load the engine, say so, then run it until ``stop`` or until the server is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from specops.engine.engine import Engine
    from specops.engine.grammar import Grammars
    from specops.serve.server import settle_heap

    try:
        engine = Engine.from_config(cfg)
        grammars = Grammars(engine.tokenizer, engine.vocab_size)
    except SpecopsError as e:
        events.send(("failed", str(e)))
        return
    except Exception as e:  # noqa: BLE001 - reported to the server, which exits with it
        log.exception("engine failed to load")
        events.send(("failed", f"engine failed to load: {type(e).__name__}: {e}"))
        return
    settle_heap()
    events.send(("ready", engine.vocab_size, list(engine.eos_token_ids)))

    def receive(block: bool) -> list[tuple]:
        cmds = []
        try:
            if block:
                cmds.append(commands.recv())
            while commands.poll():
                cmds.append(commands.recv())
        except (EOFError, OSError):  # the server is gone
            cmds.append(("stop",))
        return cmds

    core = EngineCore(engine, grammars, lambda pairs: events.send(("events", pairs, engine.stats)))
    try:
        core.run(receive)
    except (BrokenPipeError, ConnectionResetError):  # the server is gone: nobody to tell
        pass
