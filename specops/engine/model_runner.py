"""The model runner: where "run the model" happens. It owns the KV caches, every per-slot buffer and the CUDA
graphs, and runs the two kinds of step the scheduler asks for.

- ``prefill``: new requests' prompts in one forward (packed back to back on the fused CUDA path, padded rows on
  the torch path), the first token, and the first drafts.
- ``decode``: one round for the running requests: a target forward over each row's last token and its γ
  drafts, verification (rejection sampling) of all rows at once, then the next γ drafts. State between rounds
  stays on the device in per-slot tensors (the token not yet in the cache, the cache length, the pending drafts
  with the distributions they were drawn from, the sampling settings), so a round needs from the host only the
  slot of each row, and gives back one small tensor: the accepted count and tokens of each row.

A round is a fixed-shape function of those buffers. With the fused kernels on CUDA it is captured as a CUDA
graph per (batch bucket, sampling mode, drafts verified, drafts proposed) and replayed (γ may change between
rounds under ``--gamma auto`` or ``--gamma-schedule``: the rounds that switch are captured at start-up too, and a
round whose rows hold different numbers of drafts replays the same graph, each row's count read on the device):
the batch is padded up to its bucket with rows that point at a scratch slot nobody owns, so padding never touches
a request's cache. Requests under a grammar need host
work inside the round (masks per draft position), so their rounds run eagerly, as every round does on the CPU;
with schema-aware drafting their rows also draft different numbers of tokens (γ free ones plus forced runs), so
such a round is as wide as its longest row and verification knows each row's length.

``launch`` starts a round and ``collect`` waits for its result, so the engine can queue the next round before
it reads the last one (the host's bookkeeping then overlaps the device's work). A request that finished in the
round being read has one more round run for it in its slot, which nobody reads: the caches have room for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specops.engine.proposer import DraftInput, Eagle3Proposer, Proposer, SchemaProposer
from specops.engine.sampling import SamplingParams, SamplingState, logits_to_probs, mask_logits_, sample_from
from specops.engine.verify import verify
from specops.models import attention, kernels
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaForCausalLM, Rotary


@dataclass(frozen=True)
class Mode:
    """What a batch's sampling needs (decided on the host from its requests; one graph per mode)."""

    sampled: bool = False  # some row samples (temperature > 0): distributions and uniforms are needed
    filtering: bool = False  # some row cuts with top-k / top-p: a sort over the vocabulary

    @classmethod
    def of(cls, params: list[SamplingParams]) -> "Mode":
        return cls(any(not p.greedy for p in params), any(p.filters for p in params))


@dataclass
class Pending:
    """A launched round: its rows' slots and where its result lands on the host (ready once ``done``)."""

    slots: list[int]
    host: torch.Tensor  # [rows, 2 + (w + 1) + w] for a round w drafts wide: n, the length, the tokens, the drafts
    done: object = field(default=None)  # a CUDA event, or None when the result is already there


@dataclass
class Round:
    """A round's result per row: n accepted drafts; the tokens whose first n + 1 are emitted (the accepted drafts,
    then the target's correction of draft n, or its bonus token after the last draft); the drafts verified."""

    accepted: list[int]
    tokens: list[list[int]]
    drafts: list[list[int]]


def buckets(max_batch: int) -> list[int]:
    """Padded batch sizes a graph is captured for: powers of two up to ``max_batch``, and ``max_batch``."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return sizes + [max_batch]


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, draft: Eagle3Draft | None, gamma: int, max_batch: int,
                 max_seq_len: int, cuda_graphs: bool = True, bucket_padding: bool | None = None, forced: int = 0):
        """``gamma``: free draft positions per round (the EAGLE-3 draft's); ``forced``: schema-forced tokens a row
        under a grammar may draft on top of them (0: none; with no draft, forced tokens alone)."""
        self.model, self.draft, self.gamma = model, draft, gamma
        self.width = gamma + forced  # the most drafts a row verifies in one round
        self.device = model.model.embed_tokens.weight.device
        self.fused = kernels.enabled(self.device) and kernels.supports(model.config.head_dim) and (
            draft is None or kernels.supports(draft.cfg.head_dim))
        self.use_graphs = cuda_graphs and self.fused and self.device.type == "cuda"
        pad = self.use_graphs if bucket_padding is None else bucket_padding
        self.buckets = buckets(max_batch) if pad else None
        # Verification writes up to width + 1 positions past the context and drafting width more; a round that runs
        # on past a request's end (see launch) adds as much again: room for all of it past max_seq_len.
        capacity = max_seq_len + 3 * self.width + 2
        for m, cfg in ((model, model.config), (draft, draft.cfg if draft is not None else None)):
            if m is not None and m.rotary.cos.shape[0] < capacity:
                m.rotary = Rotary(cfg, capacity).to(self.device)
        self.scratch = max_batch  # the slot padding rows read and write
        slots, dev, v = max_batch + 1, self.device, model.config.vocab_size
        self.cache = model.new_cache(slots, capacity)
        self.proposer: Proposer | None = None
        if draft is not None:
            self.proposer = Eagle3Proposer(draft, gamma, slots, capacity, forced)
        elif forced:
            self.proposer = SchemaProposer(forced, v)
        self.tap_layers = draft.tap_layers if draft is not None else ()
        self.last_token = torch.zeros(slots, dtype=torch.long, device=dev)
        self.ctx_len = torch.zeros(slots, dtype=torch.long, device=dev)
        self.drafts = torch.zeros(slots, self.width, dtype=torch.long, device=dev)
        self.draft_probs = torch.zeros(slots, self.width, v, dtype=torch.float32, device=dev)
        self.draft_len = [gamma] * slots  # each slot's pending drafts (host side: γ may change between rounds)
        self.draft_count = torch.zeros(slots, dtype=torch.long, device=dev)  # the same counts, read by graphs
        self.sampling = SamplingState(slots, dev)
        self.row_slots = torch.full((max_batch,), self.scratch, dtype=torch.long, device=dev)
        self._steps = torch.arange(self.width + 1, device=dev)
        self._graphs: dict[tuple[int, Mode, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        # Host buffers in pairs, used in turn: one round's are read or written while the other round's copies are
        # still queued. Pinned, so a copy is queued without waiting for the device.
        pinned = self.device.type == "cuda"
        self._host = [torch.zeros(max_batch * (2 * self.width + 3), dtype=torch.long, pin_memory=pinned)
                      for _ in range(2)]
        self._rows = [torch.zeros(max_batch, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._turn = 0

    # -- prefill ------------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]], params: list[SamplingParams],
                constraints: list | None = None, gamma: int | None = None) -> list[int]:
        """Admit requests into ``slots``: write their prompts to the caches, sample each first token, draft the
        first drafts (``gamma`` free ones, default the runner's γ). Returns the first tokens."""
        b, dev = len(slots), self.device
        g = self.gamma if gamma is None else gamma
        self.sampling.admit(slots, params)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        slot_t = torch.tensor(slots, device=dev)
        if self.fused:  # packed: no padding anywhere
            flat = [t for p in prompts for t in p]
            tokens = torch.tensor(flat, device=dev).unsqueeze(0)
            meta = attention.TritonAttention.packed(slots, [len(p) for p in prompts], dev)
            last = lens.cumsum(0) - 1
        else:  # rows padded to the longest prompt (the torch path reads keys by row)
            t = max(len(p) for p in prompts)
            tokens = torch.zeros(b, t, dtype=torch.long, device=dev)
            for i, p in enumerate(prompts):
                tokens[i, : len(p)] = torch.tensor(p, device=dev)
            meta = attention.TorchAttention.build(slot_t, torch.arange(t, device=dev).expand(b, t))
            last = torch.arange(b, device=dev) * t + lens - 1
        logits, taps = self.model(tokens, self.cache, meta, self.tap_layers, logits_at=last)
        if constraints is not None:
            for i, c in enumerate(constraints):
                if c is not None:
                    mask_logits_(logits[i], c.mask())
        mode = Mode.of(params)
        temperature, top_k, top_p = self.sampling.rows(slot_t)
        u = self.sampling.draw(slot_t, 1 + self.width) if mode.sampled else None
        if mode.sampled:
            first = sample_from(logits_to_probs(logits, temperature, top_k, top_p, mode.filtering), u[:, 0])
        else:
            first = logits.argmax(dim=-1)
        self.ctx_len[slot_t] = lens
        self.last_token[slot_t] = first
        if self.proposer is not None:
            shifted = torch.cat([tokens[:, 1:], tokens.new_zeros(tokens.shape[0], 1)], dim=1).reshape(-1)
            shifted[last] = first  # the token after each prompt's last position
            guides = None
            if constraints is not None:
                guides = [c.drafting([tok]) if c is not None else None for c, tok in zip(constraints, first.tolist())]
            inp = DraftInput(shifted.view(tokens.shape), taps, meta, last, lens - 1, slot_t, temperature, top_k, top_p,
                             None if u is None else u[:, 1:], g, mode.filtering, guides, prefill=True)
            self._store_drafts(slots, *self.proposer.propose(inp, self._meta_for))
        return first.tolist()

    # -- decode rounds ------------------------------------------------------------------------------------------

    def decode(self, slots: list[int], mode: Mode, constraints: list | None = None, gamma: int | None = None) -> Round:
        """One round for the requests in ``slots``."""
        return self.collect(self.launch(slots, mode, constraints, gamma))

    def collect(self, pending: Pending) -> Round:
        """Wait for a launched round and read its result."""
        if pending.done is not None:
            pending.done.synchronize()
        host = pending.host.tolist()
        w = (pending.host.shape[1] - 3) // 2
        return Round([r[0] for r in host], [r[2 : w + 3] for r in host], [r[w + 3 : w + 3 + r[1]] for r in host])

    @torch.inference_mode()
    def launch(self, slots: list[int], mode: Mode, constraints: list | None = None, gamma: int | None = None
               ) -> Pending:
        """Start one round for the requests in ``slots`` (queued on the device; on the CPU it runs now): verify
        their pending drafts, then draft ``gamma`` free tokens each for the next round (default: the runner's γ;
        it may change from round to round, up to the runner's γ)."""
        b = len(slots)
        g = self.gamma if gamma is None else gamma
        padded = b if self.buckets is None else next(s for s in self.buckets if s >= b)
        rows = slots + [self.scratch] * (padded - b)
        staged = self._rows[self._turn][:padded]
        staged.copy_(torch.tensor(rows))
        self.row_slots[:padded].copy_(staged, non_blocking=True)
        counts = [self.draft_len[s] for s in slots]  # the pending drafts of each row (host side)
        w = max(counts)
        ragged = min(counts) != w
        if constraints is not None:
            result = self._round(padded, mode, w, g, ragged, constraints + [None] * (padded - b), rows)
        else:
            if self.use_graphs:
                result = self._replay(padded, mode, w, g)
            else:
                result = self._round(padded, mode, w, g, ragged)
            for s in slots:
                self.draft_len[s] = g
        if self.device.type != "cuda":
            return Pending(slots, result[:b])
        host = self._host[self._turn][: result[:b].numel()].view(b, -1)
        self._turn ^= 1
        host.copy_(result[:b], non_blocking=True)  # the round's one transfer back to the host
        done = torch.cuda.Event()
        done.record()
        return Pending(slots, host, done)

    def _meta_for(self, slots: torch.Tensor, positions: torch.Tensor):
        return attention.for_rows(self.fused, slots, positions)

    def _round(self, b: int, mode: Mode, w: int, g: int, ragged: bool = False,
               constraints: list | None = None, slots: list[int] | None = None) -> torch.Tensor:
        """Verify rows ``row_slots[:b]`` (whose slots are ``slots`` when given), w drafts wide (``ragged``: each row
        verifies its own number, ``draft_count``, at most w), and draft ``g`` free tokens each; returns
        [b, 2 + (w + 1) + w]: n, the row's number of drafts, the tokens, the drafts verified. Device work only
        unless ``constraints`` (grammar masks are computed on the host from the drafts and the emitted tokens)."""
        self.ctx_len[self.scratch :].zero_()  # padding rows start from position 0 every round
        rows = self.row_slots[:b]
        lengths = self.draft_count[rows] if ragged else None
        drafts = self.drafts[rows, :w]
        tokens = torch.cat([self.last_token[rows].unsqueeze(1), drafts], dim=1)
        positions = self.ctx_len[rows].unsqueeze(1) + self._steps[: w + 1]
        meta = self._meta_for(rows, positions)
        logits, taps = self.model(tokens, self.cache, meta, self.tap_layers)
        if constraints is not None:  # before verification: lossless w.r.t. the constrained distribution
            counts = lengths.tolist() if ragged else [w] * b
            for i, (c, row, k) in enumerate(zip(constraints, drafts.tolist(), counts)):
                if c is not None:
                    mask_logits_(logits[i, : k + 1], c.verification_masks(row[:k]))
        temperature, top_k, top_p = self.sampling.rows(rows)
        greedy = temperature == 0
        if mode.sampled:
            probs = logits_to_probs(logits, temperature, top_k, top_p, mode.filtering)
            u = self.sampling.draw(rows, w + 1 + g + (0 if constraints is None else self.width - self.gamma))
            n, out = verify(logits, probs, drafts, self.draft_probs[rows, :w], greedy, u[:, :w], u[:, w], lengths)
            u_draft = u[:, w + 1 :]
        else:  # no distributions or random draws needed
            n, out = verify(logits, None, drafts, None, greedy, None, None, lengths)
            u_draft = None
        index = torch.arange(b, device=rows.device)
        self.ctx_len[rows] += n + 1
        self.last_token[rows] = out[index, n]
        if self.proposer is not None:
            guides = None
            if constraints is not None:
                emitted = [row[: k + 1] for row, k in zip(out.tolist(), n.tolist())]
                guides = [c.drafting(e) if c is not None else None for c, e in zip(constraints, emitted)]
            inp = DraftInput(out, taps, meta, index * (w + 1) + n, positions[index, n], rows, temperature, top_k,
                             top_p, u_draft, g, mode.filtering, guides)
            self._store_drafts(slots, *self.proposer.propose(inp, self._meta_for))
        counts = torch.full_like(n, w) if lengths is None else lengths
        return torch.cat([n.unsqueeze(1), counts.unsqueeze(1), out, drafts], dim=1)

    def _store_drafts(self, slots: list[int] | None, drafts: torch.Tensor, probs: torch.Tensor | None,
                      lengths: torch.Tensor | None) -> None:
        """Pending drafts for the next verification; their distributions only matter to sampling rows. ``slots``
        (host side) when the drafts' lengths vary or differ from γ (``lengths``; None: every row drafted γ)."""
        rows = self.row_slots[: drafts.shape[0]] if slots is None else torch.tensor(slots, device=self.device)
        w = drafts.shape[1]
        self.drafts[rows, :w] = drafts
        if probs is not None:
            self.draft_probs[rows, :w] = probs
        if lengths is None:  # a scalar fill: an indexed write of a Python number would copy from the host
            self.draft_count.index_fill_(0, rows, w)
        else:
            self.draft_count[rows] = lengths
        if slots is not None:
            counts = [w] * len(slots) if lengths is None else lengths.tolist()
            for s, k in zip(slots, counts):
                self.draft_len[s] = k

    # -- CUDA graphs --------------------------------------------------------------------------------------------

    def capture_all(self, gammas) -> None:
        """Capture, before any request arrives, every round decoding replays: every bucket, greedy and sampled,
        verifying drafts of any γ in ``gammas`` and drafting any γ in ``gammas`` (a switch of γ is a round of its
        own), so no request waits for a capture (rounds that filter with top-k / top-p are captured on first
        use)."""
        if not self.use_graphs:
            return
        for b in self.buckets or []:
            for mode in (Mode(), Mode(sampled=True)):
                for w in gammas:
                    for g in gammas:
                        if (b, mode, w, g) not in self._graphs:
                            self._graphs[(b, mode, w, g)] = self._capture(b, mode, w, g)

    def _replay(self, b: int, mode: Mode, w: int, g: int) -> torch.Tensor:
        key = (b, mode, w, g)
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def _capture(self, b: int, mode: Mode, w: int, g: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture one round for ``b`` rows verifying up to ``w`` drafts (each row's own count, read on the device
        at replay) and drafting ``g``. The warm-up run (kernel compilation, library handles) uses padding rows only,
        so no request's state moves; capturing itself runs nothing."""
        live = self.row_slots[:b].clone()
        self.row_slots[:b].fill_(self.scratch)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._round(b, mode, w, g, ragged=True)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._round(b, mode, w, g, ragged=True)
        self.row_slots[:b].copy_(live)
        return graph, out
