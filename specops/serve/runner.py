"""Between the HTTP handlers and the engine: commands go in, each step's new tokens come out.

The engine is not thread-safe, so one ``EngineCore`` owns it: it applies the queued additions and aborts between
steps, steps while requests are pending, and reports every step's output. It runs on a thread of the server's
process (``EngineRunner``, here) or in a process of its own (``specops.serve.engine_process``, the default on
CUDA): there the engine's host work and the event loop's no longer take turns on one interpreter lock. The app
starts either on its event loop.

Either way the API side keeps one sink per engine request (the asyncio queue of its HTTP request) and hands a
step's events to them through an ``Outbox``: one wake-up per event loop until that loop has run, and while it is
busy a request's events pile up into one, so a loop that falls behind writes one chunk per request for several
steps instead of one per step (vLLM's output collector does the same). Whatever the engine raises for one request
(say, a prompt it refuses) goes back to that request; an exception from ``step`` fails every request in flight,
and the engine goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from specops.errors import SpecopsError

log = logging.getLogger("specops.serve")

Grammar = Optional[tuple[dict, list[int]]]  # (response_format, stop token ids) a request's constraint is built from


@dataclass
class Event:
    """New output of one engine request (``tag`` tells the choices of one HTTP request apart)."""

    tag: int = 0
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    client_error: bool = False  # the error is the request's fault (a 400), not the server's
    provenance: dict | None = None  # on the finishing event, when asked: output token ids and per-round records

    def absorb(self, later: "Event") -> None:
        """Take in the request's next event (this one not delivered yet): its tokens follow these."""
        self.token_ids += later.token_ids
        self.finished, self.finish_reason = later.finished, later.finish_reason
        self.error, self.client_error, self.provenance = later.error, later.client_error, later.provenance


class EngineCore:
    """The engine's side: commands are ``("add", id, prompt_ids, params, grammar, provenance)``, ``("abort", id)``,
    ``("gamma", id, schedule)`` (a new γ table, answered like a request that finishes at once) and ``("stop",)``;
    ``emit`` receives each step's ``(request id, Event)`` pairs."""

    def __init__(self, engine, grammars, emit: Callable[[list[tuple[str, Event]]], None]):
        self.engine, self.grammars, self.emit = engine, grammars, emit
        self.live: set[str] = set()

    def run(self, receive: Callable[[bool], list[tuple]]) -> None:
        """Apply commands and step until ``("stop",)``; ``receive(block)`` returns the commands queued since its
        last call, waiting for at least one when ``block`` (nothing left to step)."""
        while True:
            for cmd in receive(not self.engine.has_unfinished()):
                if cmd[0] == "stop":
                    self.fail_all("server is shutting down")
                    return
                self.apply(cmd)
            if self.engine.has_unfinished():
                self.step()

    def apply(self, cmd: tuple) -> None:
        if cmd[0] == "abort":
            if cmd[1] in self.live:
                self.live.discard(cmd[1])
                self.engine.abort(cmd[1])
            return
        if cmd[0] == "gamma":
            _, rid, schedule = cmd
            try:
                self.engine.use_gamma_schedule(schedule)
            except SpecopsError as e:
                self.emit([(rid, Event(finished=True, error=str(e), client_error=True))])
                return
            self.emit([(rid, Event(finished=True, finish_reason="gamma"))])
            return
        _, rid, prompt_ids, params, grammar, provenance = cmd
        try:
            constraint = None if grammar is None else self.grammars.constraint(*grammar)
            self.engine.add_request(rid, prompt_ids, params, constraint=constraint, provenance=provenance)
        except SpecopsError as e:
            self.emit([(rid, Event(finished=True, error=str(e), client_error=True))])
            return
        except Exception as e:  # noqa: BLE001 - the engine's bug must not stop it
            log.exception("engine refused request %s", rid)
            self.emit([(rid, Event(finished=True, error=f"engine error: {type(e).__name__}: {e}"))])
            return
        self.live.add(rid)

    def step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # noqa: BLE001
            log.exception("engine step failed")
            self.fail_all(f"engine error: {type(e).__name__}: {e}")
            return
        events = []
        for out in outputs:
            if out.request_id not in self.live:
                continue
            if out.finished:
                self.live.discard(out.request_id)
            prov = None
            if out.output is not None and out.output.provenance is not None:
                prov = {"token_ids": out.output.token_ids, "rounds": out.output.provenance}
            events.append((out.request_id, Event(0, list(out.new_token_ids), out.finished, out.finish_reason,
                                                  provenance=prov)))
        if events:
            self.emit(events)

    def fail_all(self, message: str) -> None:
        for rid in list(self.live):
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - best effort after an engine failure
                log.exception("abort of %s failed", rid)
        self.emit([(rid, Event(finished=True, error=message)) for rid in self.live])
        self.live.clear()


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tag: int


class Outbox:
    """Events to the asyncio queues of the loops that wait on them: one wake-up per loop until it has run; a
    request's events that arrive meanwhile are merged into one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, dict[tuple[int, int], tuple[asyncio.Queue, Event]]] = {}

    def post(self, events: list[tuple[_Sink, Event]]) -> None:
        wake = []
        with self._lock:
            for sink, event in events:
                batch = self._pending.get(sink.loop)
                if batch is None:
                    batch = self._pending[sink.loop] = {}
                    wake.append(sink.loop)
                key = (id(sink.queue), sink.tag)
                if key in batch:
                    batch[key][1].absorb(event)
                else:
                    batch[key] = (sink.queue, event)
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop in wake:
            if loop is here:  # posted from the loop itself (the engine process's reader): no self-pipe wake-up
                loop.call_soon(self._flush, loop)
                continue
            try:
                loop.call_soon_threadsafe(self._flush, loop)
            except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
                with self._lock:
                    self._pending.pop(loop, None)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            batch = self._pending.pop(loop, {})
        for queue, event in batch.values():
            queue.put_nowait(event)


class Runner:
    """The API side, whichever way the engine runs: subclasses send commands (``_send``) and feed the engine's
    events back to ``_route``. ``tokenizer``, ``vocab_size``, ``eos_token_ids`` and ``grammars`` describe the
    engine to the handlers; ``stats`` is its speculative-decoding counters."""

    tokenizer: Any
    vocab_size: int
    eos_token_ids: list[int]
    grammars: Any  # specops.engine.grammar.Grammars: checks and compiles response formats

    def __init__(self):
        self._lock = threading.Lock()
        self._sinks: dict[str, _Sink] = {}
        self._outbox = Outbox()
        self._stopping = False

    @property
    def stats(self):
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def _send(self, cmd: tuple) -> None:
        raise NotImplementedError

    def _close(self, timeout_s: float) -> None:
        raise NotImplementedError

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet finished or aborted."""
        with self._lock:
            return len(self._sinks)

    def submit(self, request_id: str, prompt_ids: list[int], params, queue: asyncio.Queue, tag: int = 0,
               grammar: Grammar = None, provenance: bool = False) -> None:
        """Queue a request; its events arrive on ``queue`` (from the calling event loop)."""
        self._listen(request_id, queue, tag)
        # Sent outside the lock, which routing the engine's events needs.
        self._send(("add", request_id, prompt_ids, params, grammar, provenance))

    async def use_gamma_schedule(self, schedule) -> None:
        """Have the engine draft by ``schedule`` from its next round on (``Engine.use_gamma_schedule``); returns once
        it does, so requests sent after, through any API process, run under it. SpecopsError if it refuses."""
        rid, queue = f"gamma-{uuid.uuid4().hex}", asyncio.Queue()
        self._listen(rid, queue, 0)
        self._send(("gamma", rid, schedule))
        event = await queue.get()
        if event.error is not None:
            raise SpecopsError(event.error)

    def _listen(self, request_id: str, queue: asyncio.Queue, tag: int) -> None:
        sink = _Sink(asyncio.get_running_loop(), queue, tag)
        with self._lock:
            if self._stopping or not self.alive:
                raise SpecopsError("server is shutting down" if self._stopping else "the engine has stopped")
            self._sinks[request_id] = sink

    def abort(self, request_id: str) -> None:
        """Cancel a request; its cache slot is freed before the engine's next step."""
        with self._lock:
            known = self._sinks.pop(request_id, None) is not None
        if known:
            self._send(("abort", request_id))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Fail whatever is left and let go of the engine: a thread's engine stops; the engine process stops once
        every API process has let go."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self._close(timeout_s)

    def _route(self, events: list[tuple[str, Event]]) -> None:
        routed = []
        with self._lock:
            for rid, event in events:
                sink = self._sinks.pop(rid, None) if event.finished else self._sinks.get(rid)
                if sink is not None:  # else aborted meanwhile: nobody is listening
                    event.tag = sink.tag
                    routed.append((sink, event))
        self._outbox.post(routed)

    def _fail_all(self, message: str) -> None:
        """Every request still waiting gets ``message`` (the engine is gone)."""
        with self._lock:
            rids = list(self._sinks)
        self._route([(rid, Event(finished=True, error=message)) for rid in rids])


class EngineRunner(Runner):
    """The engine on a thread of this process."""

    def __init__(self, engine):
        from specops.engine.grammar import Grammars

        super().__init__()
        self.engine = engine
        self.tokenizer, self.vocab_size = engine.tokenizer, engine.vocab_size
        self.eos_token_ids = list(engine.eos_token_ids)
        self.grammars = Grammars(engine.tokenizer, engine.vocab_size)
        self._cv = threading.Condition()
        self._inbox: deque[tuple] = deque()
        core = EngineCore(engine, self.grammars, self._route)
        self._thread = threading.Thread(target=core.run, args=(self._receive,), name="specops-engine", daemon=True)

    @property
    def stats(self):
        return self.engine.stats

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def _send(self, cmd: tuple) -> None:
        with self._cv:
            self._inbox.append(cmd)
            self._cv.notify()

    def _receive(self, block: bool) -> list[tuple]:
        with self._cv:
            while block and not self._inbox:
                self._cv.wait()
            cmds = list(self._inbox)
            self._inbox.clear()
        return cmds

    def _close(self, timeout_s: float) -> None:
        self._send(("stop",))
        if self._thread.ident is not None:  # started
            self._thread.join(timeout_s)
