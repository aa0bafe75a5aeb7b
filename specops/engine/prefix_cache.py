"""Prefix caching: the keys and values of a prompt's first tokens, kept from one request for the next ones that
start the same way (a task's system prompt and chat template, here 173 of a prompt's 195 tokens).

The model runner keeps each prefix in a cache slot of its own, beyond the requests' slots and the scratch slot. A
request that starts with a kept prefix gets its keys and values copied into its slot (a device copy of k positions
per layer) and a prefill of the rest of its prompt only, at positions k and on. This class is the host's side: which
prefixes are kept, in which slot, and which one a prompt uses. It never touches the device.

What is kept is found, not configured: a prompt's longest common prefix with one of the last few prompts, when it
is at least ``min_tokens`` long and ``min_tokens`` longer than the prefix the prompt could already use (so prompts
that share a few more words than the system prompt do not each take a slot). The least recently used prefix makes
room for a new one.

An EAGLE-3 draft's key and value at position i depend on token i + 1 (the draft reads the target's features at i
with the next token's embedding), so a prefix of k positions is keyed by its first k + 1 tokens. A prompt uses the
first j positions of a kept prefix when its first j + 1 tokens are the key's and it holds at least one token more
(the prefill then always has a last position to take the first token's logits from), and j is at least
``min_tokens``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

RECENT = 8  # prompts a new one is compared with


@dataclass
class Prefix:
    slot: int
    key: tuple[int, ...]  # the first k + 1 tokens of the prompts that may use it
    used: int  # when it was last planned for (a counter)

    @property
    def length(self) -> int:
        """Positions kept: k."""
        return len(self.key) - 1


@dataclass(frozen=True)
class Plan:
    """One prefill's use of the cache: per prompt the slot and length of the prefix it starts from ((None, 0): none),
    and the prefixes to keep once the prefill has run: (the prompt's row, positions, the slot to copy them into)."""

    hits: list[tuple[int | None, int]]
    keep: list[tuple[int, int, int]]


def common_length(a: tuple, b: tuple) -> int:
    """Length of the longest common prefix: a binary search over slice comparisons, which run in C (the engine's
    host time per admitted request stays in microseconds)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


class PrefixCache:
    def __init__(self, slots: list[int], min_tokens: int = 16):
        self.free = list(slots)
        self.prefixes: list[Prefix] = []
        self.min_tokens = min_tokens
        self.recent: deque[tuple[int, ...]] = deque(maxlen=RECENT)
        self._clock = 0

    def lookup(self, prompt) -> tuple[Prefix | None, int]:
        """The kept prefix ``prompt`` may start from furthest, and how many of its positions: (None, 0) for none."""
        best, most, prompt = None, 0, tuple(prompt)
        for p in self.prefixes:
            j = min(common_length(prompt, p.key) - 1, len(prompt) - 1, p.length)
            if j > most and j >= self.min_tokens:
                best, most = p, j
        return best, most

    def uncached(self, prompt) -> int:
        """Tokens of ``prompt`` a prefill computes (all but a kept prefix's)."""
        return len(prompt) - self.lookup(prompt)[1]

    def plan(self, prompts: list[list[int]]) -> Plan:
        """Which prefix each prompt starts from, and which new prefixes to keep from this prefill. The prefixes kept
        here are filled only after this prefill, so no prompt of it uses one."""
        self._clock += 1
        hits = []
        for prompt in prompts:
            hit, k = self.lookup(prompt)
            if hit is not None:
                hit.used = self._clock
            hits.append((hit.slot if hit is not None else None, k))
        keep = []
        for row, prompt in enumerate(prompts):
            key = tuple(prompt)
            shared = max((common_length(key, other) for other in self.recent), default=0)
            self.recent.append(key)
            k = shared - 1
            if k < self.min_tokens or k < self.lookup(prompt)[1] + self.min_tokens:
                continue
            slot = self._take()
            self.prefixes.append(Prefix(slot, key[: k + 1], self._clock))
            keep.append((row, k, slot))
        return Plan(hits, keep)

    def _take(self) -> int:
        """A free slot, or the least recently used prefix's."""
        if self.free:
            return self.free.pop(0)
        old = min(self.prefixes, key=lambda p: p.used)
        self.prefixes.remove(old)
        return old.slot
