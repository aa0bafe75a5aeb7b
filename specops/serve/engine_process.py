"""The engine in a process of its own, as vLLM's engine core and SGLang's scheduler run.

In one process the engine's host work (scheduling, staging inputs, reading results) and the event loop's (a chunk
per request and step, parsing, sockets) take turns on one interpreter lock, and at high concurrency that lock, not
the GPU, sets the pace. Here the engine process runs ``EngineCore`` alone; commands reach it on one pipe and each
step's events come back on another, which the server's event loop reads itself (``add_reader``): a reader thread
would contend with the loop for the lock on every step and wake it through its self-pipe. Events travel as plain
tuples, which pickle several times faster than the dataclasses they are rebuilt into.

The child is spawned (CUDA cannot be forked), ignores SIGINT and SIGTERM (the server drains its requests first,
then sends it ``stop``) and exits when the server's end of the pipe closes, so it never outlives the server.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import signal
import threading

from specops.errors import SpecopsError
from specops.serve.runner import EngineCore, Event, Runner

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
        self._stats = None  # the engine's SpecStats fields, as of its last step
        self._loop = None
        self._exit_task = None
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

    @property
    def stats(self):
        from specops.engine.stats import SpecStats

        return SpecStats(*self._stats) if self._stats is not None else SpecStats()

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def start(self) -> None:
        """Read the engine's events on the running event loop (call it from that loop)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._events.fileno(), self._read)

    def _send(self, cmd: tuple) -> None:
        try:
            with self._send_lock:
                self._commands.send(cmd)
        except (OSError, ValueError):  # the engine is gone: the reader fails its requests
            pass

    def _read(self) -> None:
        """Route every message waiting on the events pipe; on its end, fail what is left once the child is gone."""
        try:
            while self._events.poll():
                _, events, self._stats = self._events.recv()
                self._route([(rid, Event(0, *fields)) for rid, *fields in events])
        except (EOFError, OSError):
            self._loop.remove_reader(self._events.fileno())
            self._exit_task = self._loop.create_task(self._exited())

    async def _exited(self) -> None:
        await asyncio.to_thread(self._proc.join, 5)
        if not self._stopping:
            log.error("the engine process exited (exit code %s)", self._proc.exitcode)
        self._fail_all(f"the engine process exited (exit code {self._proc.exitcode})")

    def _close(self, timeout_s: float) -> None:
        if self._loop is not None and self._exit_task is None and not self._events.closed:
            self._loop.remove_reader(self._events.fileno())
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._commands.close()
        self._events.close()
        self._fail_all("server is shutting down")


def _wire(events: list[tuple[str, Event]]) -> list[tuple]:
    return [(rid, e.token_ids, e.finished, e.finish_reason, e.error, e.client_error, e.provenance)
            for rid, e in events]


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

    def emit(pairs: list[tuple[str, Event]]) -> None:
        s = engine.stats
        events.send(("events", _wire(pairs),
                     (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.accepted_per_pos)))

    core = EngineCore(engine, grammars, emit)
    try:
        core.run(receive)
    except (BrokenPipeError, ConnectionResetError):  # the server is gone: nobody to tell
        pass
