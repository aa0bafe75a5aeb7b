"""The model runner: where "run the model" happens. It owns the KV caches, every per-slot buffer and the CUDA
graphs, and runs the two kinds of step the scheduler asks for.

- ``prefill``: new requests' prompts in one forward (packed back to back on the fused CUDA path, padded rows on
  the torch path), the first token, and the first drafts. On CUDA the packed prompts are padded to a token
  bucket and the prefill replays the CUDA graph captured for it (padding tokens and rows write only the scratch
  slot); its first tokens come back like a round's result, read when the engine is ready for them. A prompt that
  starts with a cached prefix (``prefix_cache``) gets that prefix's keys and values copied into its slot, for the
  target and the draft, and the prefill computes the rest of it only.
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
a request's cache. Requests under a grammar need host work inside the round (masks per draft position), so their
rounds run eagerly, as every round does on the CPU; with schema-aware drafting their rows also draft different
numbers of tokens (γ free ones plus forced runs), so such a round is as wide as its longest row and verification
knows each row's length.

``launch`` starts a round and ``collect`` waits for its result, so the engine can queue the next round before
it reads the last one (the host's bookkeeping then overlaps the device's work). A request that finished in the
round being read has one more round run for it in its slot, which nobody reads: the caches have room for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specops.engine.prefix_cache import PrefixCache
from specops.engine.proposer import DraftInput, Eagle3Proposer, Proposer, SchemaProposer
from specops.engine.sampling import SamplingParams, SamplingState, logits_to_probs, mask_logits_, sample_from
from specops.engine.verify import verify
from specops.models import attention, kernels
from specops.models.eagle3 import Eagle3Draft
from specops.models.attention import PACKED_BLOCK
from specops.models.llama import LlamaForCausalLM, Rotary
from specops.models.ops import upload


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
    """A launched round or prefill: where its result lands on the host (ready once ``done``)."""

    host: torch.Tensor  # a round w drafts wide: [rows, 2 + (w + 1) + w] (n, the length, the tokens, the drafts);
    # a prefill: [rows], the first tokens
    done: object = field(default=None)  # a CUDA event, or None when the result is already there

    def read(self) -> list:
        """The result as lists (waits for the device)."""
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()


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


PREFILL_TOKENS = [16 << i for i in range(8)]  # 16 … 2048: the token counts a prefill graph is captured for


def prefill_shapes(max_rows: int) -> list[tuple[int, int]]:
    """The captured prefills' shapes: (tokens n, rows r) for each n of ``PREFILL_TOKENS``, with room for
    r = min(``max_rows``, n / 16) prompts."""
    return [(n, min(max_rows, n // PACKED_BLOCK)) for n in PREFILL_TOKENS]


def prefill_shape(lengths: list[int], max_rows: int) -> tuple[int, int] | None:
    """The smallest captured prefill that holds prompts of these lengths and at least one padding token (the one
    padding rows point at: a row's last token is written to, and must be its own); None when none does."""
    return next(((n, r) for n, r in prefill_shapes(max_rows) if sum(lengths) < n and len(lengths) <= r), None)


def prefill_layout(n: int, r: int) -> list[int]:
    """Sizes of a captured prefill's inputs in its input buffer: tokens, their slots and positions [n]; the
    sequences' slots, first positions, first token indices and lengths [r + 1, the last one always empty]; the query
    blocks' sequences and first offsets [n / 16 + r: the most blocks n tokens of r prompts make]; each row's last
    token [r]."""
    blocks = n // PACKED_BLOCK + r
    return [n, n, n, r + 1, r + 1, r + 1, r + 1, blocks, blocks, r]


class HostBuffers:
    """A pair of pinned host buffers used in turn: one result is read while the copy into the other is queued."""

    def __init__(self, size: int, pinned: bool):
        self.buffers = [torch.zeros(size, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.turn = 0

    def next(self, n: int) -> torch.Tensor:
        buf = self.buffers[self.turn][:n]
        self.turn ^= 1
        return buf


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, draft: Eagle3Draft | None, gamma: int, max_batch: int,
                 max_seq_len: int, cuda_graphs: bool = True, bucket_padding: bool | None = None, forced: int = 0,
                 prefix_slots: int = 0):
        """``gamma``: free draft positions per round (the EAGLE-3 draft's); ``forced``: schema-forced tokens a row
        under a grammar may draft on top of them (0: none; with no draft, forced tokens alone); ``prefix_slots``:
        cache slots for cached prompt prefixes (0: no prefix caching)."""
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
        self.cache = model.new_cache(slots + prefix_slots, capacity)  # cached prefixes in the slots after scratch
        self.prefixes = PrefixCache(list(range(slots, slots + prefix_slots))) if prefix_slots else None
        self.proposer: Proposer | None = None
        if draft is not None:
            self.proposer = Eagle3Proposer(draft, gamma, slots + prefix_slots, capacity, forced)
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
        # Host buffers, pinned, so a copy is queued without waiting for the device: rounds' results, their row
        # slots, prefills' first tokens.
        pinned = self.device.type == "cuda"
        self._host = HostBuffers(max_batch * (2 * self.width + 3), pinned)
        self._rows = HostBuffers(max_batch, pinned)
        self._first = HostBuffers(max_batch, pinned)
        # Captured prefills read their inputs from one device buffer, laid out per shape by ``prefill_layout``.
        self._prefill_graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, int | None]] = {}
        # A group of prompts too large for every padded prefill would run unpadded, eagerly, and on CUDA the first
        # such prefill of a process compiles kernels (over a second on an H100): admission keeps each group within
        # the largest (tokens, rows).
        self.prefill_limit = prefill_shapes(self.scratch)[-1] if self.buckets is not None and self.fused else None
        if self.buckets is not None and self.fused:
            self._prefill_in = torch.zeros(sum(prefill_layout(PREFILL_TOKENS[-1], max_batch)), dtype=torch.long,
                                           device=dev)

    # -- prefill ------------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]], params: list[SamplingParams],
                constraints: list | None = None, gamma: int | None = None, cached: bool = True) -> Pending:
        """Admit requests into ``slots``: write their prompts to the caches, sample each first token, draft the
        first drafts (``gamma`` free ones, default the runner's γ). Queued on the device like a round; the first
        tokens are the pending result (``Pending.read``). With bucket padding on the fused path a prefill that fits
        a token bucket (``prefill_shape``) is padded to it, and with CUDA graphs replays the one captured for it;
        grammar rows and top-k / top-p rows run unpadded. ``cached``: use and keep prefixes (False: compute every
        prompt whole and keep nothing, as a timing of a full prefill needs)."""
        g = self.gamma if gamma is None else gamma
        mode = Mode.of(params)
        self.sampling.admit(slots, params)
        plan = self.prefixes.plan(prompts) if self.prefixes is not None and cached else None
        offsets = [0] * len(prompts)  # each row's first position
        if plan is not None:  # each row's cached prefix into its slot; the prefill computes the rest
            offsets = [k for _, k in plan.hits]
            for slot, (src, k) in zip(slots, plan.hits):
                if src is not None:
                    self._copy(src, slot, k)
            prompts = [p[k:] for p, k in zip(prompts, offsets)]
        shape = None
        if self.buckets is not None and self.fused and constraints is None and not mode.filtering:
            shape = prefill_shape([len(p) for p in prompts], self.scratch)
        if shape is None:
            first, drafted = self._prefill_eager(slots, prompts, offsets, mode, constraints, g)
        elif self.use_graphs:
            key = (shape, mode, g)
            if key not in self._prefill_graphs:
                self._prefill_graphs[key] = self._capture_prefill(*key)
            self._stage_prefill(shape, slots, prompts, offsets)
            graph, first, drafted = self._prefill_graphs[key]
            graph.replay()
        else:  # the same padded prefill, run eagerly (how the CPU checks what the graphs replay)
            self._stage_prefill(shape, slots, prompts, offsets)
            first, drafted = self._prefill_body(*self._prefill_views(shape), mode, g)
        if drafted is not None:
            self._note_drafts(slots, drafted)
        for row, k, dst in plan.keep if plan is not None else ():  # queued after the prefill that writes them
            self._copy(slots[row], dst, k)
        return self._to_host(first[: len(slots)], self._first)  # padded prefills have rows past the prompts

    def uncached(self, prompt: list[int]) -> int:
        """Tokens of ``prompt`` its prefill computes: all but a cached prefix's."""
        return self.prefixes.uncached(prompt) if self.prefixes is not None else len(prompt)

    def _copy(self, src: int, dst: int, length: int) -> None:
        """Positions [0, length) of one slot into another, in the target's cache and the draft's."""
        self.cache.copy(src, dst, length)
        if isinstance(self.proposer, Eagle3Proposer):
            self.proposer.cache.copy(src, dst, length)

    def _prefill_eager(self, slots, prompts, offsets, mode, constraints, g):
        dev = self.device
        lens = upload([len(p) for p in prompts], torch.long, dev)
        slot_t = upload(slots, torch.long, dev)
        start = upload(offsets, torch.long, dev)
        if self.fused:  # packed: no padding anywhere
            tokens = upload([t for p in prompts for t in p], torch.long, dev).unsqueeze(0)
            meta = attention.TritonAttention.packed(slots, [len(p) for p in prompts], dev, offsets)
            last = lens.cumsum(0) - 1
        else:  # rows padded to the longest prompt (the torch path reads keys by row)
            b, t = len(prompts), max(len(p) for p in prompts)
            tokens = upload([p + [0] * (t - len(p)) for p in prompts], torch.long, dev)
            # Padding stays inside the slot's cache, where nothing reads it before a later write.
            positions = (start.view(b, 1) + torch.arange(t, device=dev)).clamp_(max=self.cache.max_len - 1)
            meta = attention.TorchAttention.build(slot_t, positions)
            last = torch.arange(b, device=dev) * t + lens - 1
        return self._prefill_body(tokens, meta, last, lens, slot_t, start, mode, g, constraints)

    def _prefill_body(self, tokens, meta, last, lens, slot_t, start, mode: Mode, g: int, constraints=None):
        """A prefill's device work over ``lens`` tokens per row from position ``start`` on: returns the first
        tokens [R] and what the rows drafted (their count, or per row a tensor of counts; None without a proposer).
        Device work only unless ``constraints``."""
        logits, taps = self.model(tokens, self.cache, meta, self.tap_layers, logits_at=last)
        if constraints is not None:
            for i, c in enumerate(constraints):
                if c is not None:
                    mask_logits_(logits[i], c.mask())
        temperature, top_k, top_p = self.sampling.rows(slot_t)
        u = self.sampling.draw(slot_t, 1 + self.width) if mode.sampled else None
        if mode.sampled:
            first = sample_from(logits_to_probs(logits, temperature, top_k, top_p, mode.filtering), u[:, 0])
        else:
            first = logits.argmax(dim=-1)
        self.ctx_len[slot_t] = start + lens
        self.last_token[slot_t] = first
        if self.proposer is None:
            return first, None
        shifted = torch.cat([tokens[:, 1:], tokens.new_zeros(tokens.shape[0], 1)], dim=1).reshape(-1)
        shifted[last] = first  # the token after each prompt's last position
        guides = None
        if constraints is not None:
            guides = [c.drafting([tok]) if c is not None else None for c, tok in zip(constraints, first.tolist())]
        inp = DraftInput(shifted.view(tokens.shape), taps, meta, last, start + lens - 1, slot_t, temperature, top_k,
                         top_p, None if u is None else u[:, 1:], g, mode.filtering, guides, prefill=True)
        drafts, probs, lengths = self.proposer.propose(inp, self._meta_for)
        self._store_drafts(slot_t, drafts, probs, lengths)
        return first, (drafts.shape[1] if lengths is None else lengths)

    def _stage_prefill(self, shape: tuple[int, int], slots: list[int], prompts: list[list[int]],
                       offsets: list[int]) -> None:
        """Write a bucketed prefill's inputs into the captured graphs' input buffer, in one host-to-device copy:
        the prompts packed back to back (each from its first position, ``offsets``), then padding that writes only
        the scratch slot (see ``prefill_layout``)."""
        n, r = shape
        lens = [len(p) for p in prompts]
        tok_slot, tok_pos, starts, blk_seq, blk_q0 = attention.packed_tables(slots, lens, offsets)
        pad_tok, pad_seq, pad_blk = n - sum(lens), r + 1 - len(lens), n // PACKED_BLOCK + r - len(blk_seq)
        values = ([t for p in prompts for t in p] + [0] * pad_tok
                  + tok_slot + [self.scratch] * pad_tok
                  + tok_pos + [0] * pad_tok
                  + slots + [self.scratch] * pad_seq
                  + offsets + [0] * pad_seq
                  + starts + [0] * pad_seq
                  + lens + [0] * pad_seq
                  + blk_seq + [r] * pad_blk  # padding blocks belong to the empty sequence r
                  + blk_q0 + [0] * pad_blk
                  + [s + k - 1 for s, k in zip(starts, lens)] + [n - 1] * (r - len(lens)))  # n - 1: padding
        self._prefill_in[: len(values)].copy_(upload(values, torch.long, self.device), non_blocking=True)

    def _prefill_views(self, shape: tuple[int, int]):
        """The captured prefill's inputs for ``shape``, as views of the input buffer (``_stage_prefill`` fills it
        in this order): tokens [1, n], attention metadata, last [r], lengths [r], slots [r], first positions [r]."""
        n, r = shape
        sizes = prefill_layout(n, r)
        parts = list(torch.split(self._prefill_in[: sum(sizes)], sizes))
        tokens, tok_slot, tok_pos, seq_slot, seq_pos0, seq_start, seq_len, blk_seq, blk_q0, last = parts
        meta = attention.TritonAttention(tok_slot, tok_pos, seq_slot, seq_pos0, seq_start, seq_len, blk_seq, blk_q0,
                                         PACKED_BLOCK)
        return tokens.view(1, n), meta, last, seq_len[:r], seq_slot[:r], seq_pos0[:r]

    # -- decode rounds ------------------------------------------------------------------------------------------

    def decode(self, slots: list[int], mode: Mode, constraints: list | None = None, gamma: int | None = None) -> Round:
        """One round for the requests in ``slots``."""
        return self.collect(self.launch(slots, mode, constraints, gamma))

    def collect(self, pending: Pending) -> Round:
        """Wait for a launched round and read its result."""
        host = pending.read()
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
        staged = self._rows.next(padded)
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
        return self._to_host(result[:b], self._host)

    def _to_host(self, result: torch.Tensor, buffers: HostBuffers) -> Pending:
        """Queue a step's one transfer back to the host (on the CPU the result is already there)."""
        if self.device.type != "cuda":
            return Pending(result)
        host = buffers.next(result.numel()).view(result.shape)
        host.copy_(result, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Pending(host, done)

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
            proposed, probs, drafted = self.proposer.propose(inp, self._meta_for)
            self._store_drafts(rows, proposed, probs, drafted)
            if slots is not None:
                self._note_drafts(slots, proposed.shape[1] if drafted is None else drafted)
        counts = torch.full_like(n, w) if lengths is None else lengths
        return torch.cat([n.unsqueeze(1), counts.unsqueeze(1), out, drafts], dim=1)

    def _store_drafts(self, rows: torch.Tensor, drafts: torch.Tensor, probs: torch.Tensor | None,
                      lengths: torch.Tensor | None) -> None:
        """Pending drafts of ``rows`` (slots) for the next verification; their distributions only matter to
        sampling rows; ``lengths``: each row's count (None: every row drafted as many as ``drafts`` is wide)."""
        w = drafts.shape[1]
        self.drafts[rows, :w] = drafts
        if probs is not None:
            self.draft_probs[rows, :w] = probs
        if lengths is None:  # a scalar fill: an indexed write of a Python number would copy from the host
            self.draft_count.index_fill_(0, rows, w)
        else:
            self.draft_count[rows] = lengths

    def _note_drafts(self, slots: list[int], drafted: int | torch.Tensor) -> None:
        """The host's copy of the slots' draft counts (one count for all, or a tensor of one per slot)."""
        counts = [drafted] * len(slots) if isinstance(drafted, int) else drafted.tolist()
        for s, k in zip(slots, counts):
            self.draft_len[s] = k

    # -- CUDA graphs --------------------------------------------------------------------------------------------

    def capture_all(self, gammas) -> None:
        """Capture, before any request arrives, every round decoding replays: every bucket, greedy and sampled,
        verifying drafts of any γ in ``gammas`` and drafting any γ in ``gammas`` (a switch of γ is a round of its
        own), so no request waits for a capture (rounds that filter with top-k / top-p are captured on first
        use); and every prefill shape, greedy and sampled, drafting any γ in ``gammas``."""
        if not self.use_graphs:
            return
        for mode in (Mode(), Mode(sampled=True)):
            for g in gammas:
                for b in self.buckets or []:
                    for w in gammas:
                        if (b, mode, w, g) not in self._graphs:
                            self._graphs[(b, mode, w, g)] = self._capture(b, mode, w, g)
                for shape in prefill_shapes(self.scratch):
                    if (shape, mode, g) not in self._prefill_graphs:
                        self._prefill_graphs[(shape, mode, g)] = self._capture_prefill(shape, mode, g)

    def _replay(self, b: int, mode: Mode, w: int, g: int) -> torch.Tensor:
        key = (b, mode, w, g)
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def _capture(self, b: int, mode: Mode, w: int, g: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture one round for ``b`` rows verifying up to ``w`` drafts (each row's own count, read on the device
        at replay) and drafting ``g``, over padding rows only, so no request's state moves."""
        live = self.row_slots[:b].clone()
        self.row_slots[:b].fill_(self.scratch)
        graph, out = self._graph(lambda: self._round(b, mode, w, g, ragged=True))
        self.row_slots[:b].copy_(live)
        return graph, out

    def _capture_prefill(self, shape: tuple[int, int], mode: Mode, g: int
                         ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, int | None]:
        """Capture a prefill of ``shape`` drafting ``g``, over padding only (every token in the scratch slot, every
        sequence empty). Returns the graph, its first tokens [r] and the rows' draft count."""
        self._stage_prefill(shape, [], [], [])
        views = self._prefill_views(shape)
        graph, (first, drafted) = self._graph(lambda: self._prefill_body(*views, mode, g))
        return graph, first, drafted

    def _graph(self, step):
        """``step()`` (device work only) captured as a CUDA graph, after one warm-up run on a side stream (kernel
        compilation, library handles); returns the graph and what ``step`` returned while captured. Every graph
        shares one memory pool: they never run at the same time."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = step()
        return graph, out
