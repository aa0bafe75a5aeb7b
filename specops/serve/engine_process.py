"""The engine in a process of its own, as vLLM's engine core and SGLang's scheduler run, serving one or more API
processes.

In one process the engine's host work (scheduling, staging inputs, reading results) and the event loop's (a chunk
per request and step, parsing, sockets) take turns on one interpreter lock, and at high concurrency that lock, not
the GPU, sets the pace. Here the engine process runs ``EngineCore`` alone. Each API process has a link to it: a
pipe for its commands and one for the events of its requests, which the API process's event loop reads itself
(``add_reader``): a reader thread would contend with the loop for the lock on every step and wake it through its
self-pipe. Commands leave through a writer thread instead, so the loop never waits on a full command pipe while the
engine waits on a full event pipe for the loop to read (a burst of requests while many stream). Events travel as
plain tuples, which pickle several times faster than the dataclasses they are rebuilt into.

The child is spawned (CUDA cannot be forked) and ignores SIGINT and SIGTERM: each API process drains its requests
first, then closes its link. A closed link's requests are aborted (that API process is gone); once every link is
closed the engine exits, so it never outlives the server.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import queue
import signal
import threading
from collections import defaultdict
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Optional

from specops.errors import SpecopsError
from specops.serve.runner import EngineCore, Event, Runner

log = logging.getLogger("specops.serve")

Link = tuple  # (commands: Connection to send on, events: Connection to receive from), an API process's end


class EngineProcess:
    """The engine of ``cfg`` (an EngineConfig) in a child process with ``links`` links, one per API process;
    returns once it is loaded, raises SpecopsError with the child's message when loading fails."""

    def __init__(self, cfg, links: int = 1):
        ctx = mp.get_context("spawn")
        engine_ends, self.links = [], []
        for _ in range(links):
            commands_out, commands_in = ctx.Pipe(duplex=False)
            events_out, events_in = ctx.Pipe(duplex=False)
            engine_ends.append((commands_out, events_in))
            self.links.append((commands_in, events_out))
        self.proc = ctx.Process(target=_main, args=(cfg, engine_ends), name="specops-engine", daemon=True)
        self.proc.start()
        for commands_out, events_in in engine_ends:
            commands_out.close()
            events_in.close()
        self.model = cfg.model
        try:
            msg = self.links[0][1].recv()
        except EOFError:
            self.proc.join(5)
            raise SpecopsError(f"the engine process exited while loading (exit code {self.proc.exitcode})") from None
        if msg[0] == "failed":
            self.proc.join(5)
            raise SpecopsError(msg[1])
        _, self.vocab_size, self.eos_token_ids = msg

    def client(self, i: int = 0, peers: Optional["Peers"] = None) -> "EngineClient":
        """The runner of the API process in this one, over link ``i``; ``peers``: the other API processes."""
        return EngineClient(self.links[i], self.model, self.vocab_size, self.eos_token_ids, owner=self, peers=peers)


@dataclass(frozen=True)
class Peers:
    """The other API processes, held by the one that started the engine: they start serving when it does (``go``),
    and its ``stop`` stops them, and waits for them, before the engine."""

    processes: tuple
    go: Any  # a multiprocessing Event


class EngineClient(Runner):
    """One API process's side of the engine process: its commands out, the events of its requests in."""

    def __init__(self, link: Link, model, vocab_size: int, eos_token_ids: list[int],
                 owner: Optional[EngineProcess] = None, peers: Optional[Peers] = None):
        from specops.engine.grammar import Grammars
        from specops.models.target import load_tokenizer

        super().__init__()
        self._commands, self._events = link
        self._owner, self._peers = owner, peers  # the process that started the engine holds it and its peers
        self.vocab_size, self.eos_token_ids = vocab_size, list(eos_token_ids)
        self.tokenizer = load_tokenizer(model, vocab_size)
        self.grammars = Grammars(self.tokenizer, vocab_size)
        self._stats = None  # the engine's SpecStats fields, as of its last step
        self._gone = False  # the engine closed this link
        self._pending: queue.SimpleQueue = queue.SimpleQueue()  # commands for the writer; None ends it
        self._writer = threading.Thread(target=self._write, name="specops-engine-commands", daemon=True)
        self._writer.start()
        self._loop = None
        self._exit_task = self._watch_task = None

    @property
    def stats(self):
        from specops.engine.stats import SpecStats

        return SpecStats(*self._stats) if self._stats is not None else SpecStats()

    @property
    def alive(self) -> bool:
        return not self._gone and (self._owner is None or self._owner.proc.is_alive())

    def start(self) -> None:
        """Read the engine's events on the running event loop (call it from that loop)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._events.fileno(), self._read)
        if self._peers is not None:
            self._peers.go.set()
            self._watch_task = self._loop.create_task(self._watch_peers())

    async def _watch_peers(self) -> None:
        """Log an API process that dies (its socket closes, so new connections go to the others) and reap it."""
        left = {p.sentinel: p for p in self._peers.processes}
        while left:
            ended = await asyncio.to_thread(wait, list(left))
            if self._stopping:  # shutdown joins them
                return
            for sentinel in ended:
                p = left.pop(sentinel)
                log.error("API process %s exited (exit code %s); the others go on serving", p.name, p.exitcode)

    def _send(self, cmd: tuple) -> None:
        self._pending.put(cmd)

    def _write(self) -> None:
        while (cmd := self._pending.get()) is not None:
            try:
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
            self._gone = True
            self._loop.remove_reader(self._events.fileno())
            self._exit_task = self._loop.create_task(self._exited())

    async def _exited(self) -> None:
        why = "the engine process exited"
        if self._owner is not None:
            await asyncio.to_thread(self._owner.proc.join, 5)
            why += f" (exit code {self._owner.proc.exitcode})"
        if not self._stopping:
            log.error(why)
        self._fail_all(why)

    def _close(self, timeout_s: float) -> None:
        peers = self._peers.processes if self._peers is not None else ()
        for p in peers:  # they drain their requests first; the engine serves them meanwhile
            p.terminate()
        for p in peers:
            _join(p, timeout_s)
        if self._loop is not None and not self._gone:
            self._loop.remove_reader(self._events.fileno())
        self._pending.put(None)
        self._writer.join(timeout_s)
        self._commands.close()  # the engine aborts what this link still has, and exits once every link is closed
        if self._owner is not None:
            _join(self._owner.proc, timeout_s)
        self._events.close()
        self._fail_all("server is shutting down")


def _join(proc, timeout_s: float) -> None:
    """Wait for a child process to exit, killing it after ``timeout_s``."""
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _wire(events: list[tuple[str, Event]]) -> list[tuple]:
    return [(rid, e.token_ids, e.finished, e.finish_reason, e.error, e.client_error, e.provenance)
            for rid, e in events]


def _main(cfg, links: list[tuple]) -> None:
    """The child: load the engine, say so on the first link, then serve every link until all are closed."""
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
        links[0][1].send(("failed", str(e)))
        return
    except Exception as e:  # noqa: BLE001 - reported to the server, which exits with it
        log.exception("engine failed to load")
        links[0][1].send(("failed", f"engine failed to load: {type(e).__name__}: {e}"))
        return
    settle_heap()
    links[0][1].send(("ready", engine.vocab_size, list(engine.eos_token_ids)))

    open_links = dict(enumerate(links))
    owner: dict[str, int] = {}  # engine request id -> the link it came in on
    closed: list[int] = []  # links found closed since the last receive
    idle_stats = [None]  # the counters last sent to every link

    def stats() -> tuple:
        s = engine.stats
        return s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, list(s.accepted_per_pos)

    def send(i: int, events: list[tuple], counters: tuple) -> None:
        try:
            open_links[i][1].send(("events", events, counters))
        except OSError:  # that API process is gone
            open_links.pop(i, None)
            closed.append(i)

    def receive(block: bool) -> list[tuple]:
        if block and (now := stats()) != idle_stats[0]:  # going idle: every API process learns the final counters
            idle_stats[0] = now
            for i in list(open_links):
                send(i, [], idle_stats[0])
        cmds = []
        ready = wait([c for c, _ in open_links.values()], None if block and open_links else 0)
        by_conn = {c: i for i, (c, _) in open_links.items()}
        for conn in ready:
            i = by_conn[conn]
            try:
                while conn.poll():
                    cmd = conn.recv()
                    if cmd[0] in ("add", "gamma"):
                        owner[cmd[1]] = i
                    elif cmd[0] == "abort":
                        owner.pop(cmd[1], None)
                    cmds.append(cmd)
            except (EOFError, OSError):
                open_links.pop(i, None)
                closed.append(i)
        for i in closed:  # its requests have nobody to go to
            orphans = [rid for rid, j in owner.items() if j == i]
            cmds += [("abort", rid) for rid in orphans]
            for rid in orphans:
                del owner[rid]
        closed.clear()
        if not open_links:
            cmds.append(("stop",))
        return cmds

    def emit(pairs: list[tuple[str, Event]]) -> None:
        by_link = defaultdict(list)
        for rid, event in pairs:
            i = owner.pop(rid, None) if event.finished else owner.get(rid)
            if i in open_links:
                by_link[i].append((rid, event))
        counters = stats()
        for i, events in by_link.items():
            send(i, _wire(events), counters)

    core = EngineCore(engine, grammars, emit)
    core.run(receive)
