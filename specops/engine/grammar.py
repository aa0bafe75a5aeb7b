"""Grammar-constrained decoding (JSON schema / any JSON) through xgrammar, shaped for speculative decoding.

A request's ``Constraint`` owns one xgrammar matcher at the state after the tokens emitted so far. For one
speculative step the engine asks for the allowed-token masks at the γ+1 verified positions of a draft chain:
the matcher is advanced through the draft tokens on a ``speculate()`` cursor, a mask is filled at each
position, and the cursor rolls back on exit. Masking the target logits with these masks before verification
keeps speculative decoding lossless with respect to the constrained distribution; masking the draft's
proposals with them only raises acceptance. Emitted tokens are then ``commit``ted.

Compilation follows vLLM's xgrammar backend (``any_whitespace=True``, strict mode; ``json_object`` is
xgrammar's built-in JSON grammar), so both servers constrain a request to the same language, with one repair:
xgrammar 0.2.9 spells a string with ``minLength`` / ``maxLength`` as a bounded repetition of a character class that
admits raw U+0000–U+001F (except CR/LF), which strict JSON parsers reject, and no escapes at all (mlc-ai/xgrammar
#800). That class is replaced by one JSON-encoded character (one code point, as jsonschema counts length), so such
strings are strict JSON and may hold escapes; vLLM's backend keeps xgrammar's, and differs from ours only there.

Forced tokens (schema-aware drafting). Under ``any_whitespace`` almost nothing is forced to the letter (a space
may follow every brace and comma), yet a model trained on canonical JSON writes the same separators every time.
So a constraint also walks a second matcher for the schema without free whitespace (``json.dumps``'s own
separators) and takes what *it* forces next, its jump-forward string, as the forced text: tokenized canonically,
the last token dropped unless the text ends the output (that token may merge with the free text after it). These
tokens are only proposals: the target verifies them under the real grammar, so output never depends on them.
Once an emitted token leaves the canonical language the request drafts without forced tokens.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator, Sequence

import torch
import xgrammar as xg

from specops.errors import SpecopsError

_SHIFTS = torch.arange(32, dtype=torch.int32)

# One character of a length-bounded string in xgrammar's grammar, as its printer writes it: a class in a rule
# repeated {minLength, maxLength} times, or inlined for short bounds. A backslash inside an EBNF string literal is
# always doubled and a JSON literal cannot hold a raw quote, so this text appears nowhere else.
_BOUNDED_CHAR = r'[^\"\\\r\n]'
_HEX = "[0-9A-Fa-f]"
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|.)")
# One character of the decoded string, as jsonschema counts them (code points): an unescaped one, a short escape,
# a \uXXXX outside the surrogates, or a surrogate pair. A lone surrogate is no character and is left out, raw
# too (xgrammar takes its 3-byte encoding, which is not UTF-8: decoded, it becomes three U+FFFD).
_JSON_CHAR = (r'(([^"\\\0-\x1f\uD800-\uDFFF]) | ("\\" [\"\\/bfnrt]) | ("\\u" [0-9A-Ca-cE-Fe-f] {h} {h} {h})'
              r' | ("\\u" [Dd] [0-7] {h} {h}) | ("\\u" [Dd] [89ABab] {h} {h} "\\u" [Dd] [C-Fc-f] {h} {h}))'
              ).format(h=_HEX)


class GrammarError(SpecopsError):
    """A response_format the grammar compiler cannot turn into a grammar (the client's mistake)."""


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's packed int32 bitmask [n, ⌈V/32⌉] → bool [n, V] (True = allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def grammar_key(response_format: dict[str, Any]) -> str:
    """Cache key of a response_format: the schema's JSON with key order kept (property order is meaningful)."""
    kind = response_format.get("type")
    if kind == "json_object":
        return "json_object"
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise GrammarError("response_format.json_schema must be an object with a 'schema' object")
        _check_refs(spec["schema"])
        return "json_schema:" + json.dumps(spec["schema"], ensure_ascii=False)
    raise GrammarError(f"unsupported response_format type {kind!r} (use 'json_schema' or 'json_object')")


def _check_refs(schema: dict[str, Any]) -> None:
    """Refuse a ``$ref`` outside the schema (a file, a URL, an anchor): nothing is ever fetched, and xgrammar reads
    such a reference as "any value", so accepting it would quietly drop that part of the constraint. Every value
    is searched, const and enum data included: telling schema from data by key name would let a property named
    "enum" through."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref != "#" and not ref.startswith("#/"):
                raise GrammarError("$ref must point inside the schema ('#' or '#/...'); files and URLs are not read")
            stack.extend(node.values())


class Grammars:
    """Compiles response formats for one tokenizer and model vocabulary, keeping the most recent ones."""

    def __init__(self, tokenizer, vocab_size: int, max_cached: int = 64):
        self.vocab_size = vocab_size
        info = xg.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[str, tuple[xg.CompiledGrammar, xg.CompiledGrammar | None]] = OrderedDict()
        self._encode = lru_cache(maxsize=4096)(lambda text: tuple(tokenizer.encode(text, add_special_tokens=False)))
        self._max_cached = max_cached
        self._lock = threading.Lock()

    def compile(self, response_format: dict[str, Any]) -> tuple[xg.CompiledGrammar, xg.CompiledGrammar | None]:
        """The grammar, and the same schema without free whitespace (None for ``json_object``)."""
        key = grammar_key(response_format)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            if key == "json_object":
                compiled = self._compiler.compile_builtin_json_grammar(), None
            else:
                schema = key.split(":", 1)[1]
                compiled = (self._compiler.compile_grammar(schema_grammar(schema, any_whitespace=True)),
                            self._compiler.compile_grammar(schema_grammar(schema, any_whitespace=False)))
        except RuntimeError as e:
            raise GrammarError(f"invalid JSON schema: {_short(e)}") from None
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
        return compiled

    def constraint(self, response_format: dict[str, Any], stop_token_ids: Sequence[int]) -> "Constraint":
        """A fresh per-request constraint; ``stop_token_ids`` end the output once the grammar is complete."""
        grammar, canonical = self.compile(response_format)
        return Constraint(grammar, self.vocab_size, stop_token_ids, canonical, self._encode)


def schema_grammar(schema: str, any_whitespace: bool) -> xg.Grammar:
    """xgrammar's grammar for a JSON schema (strict mode), its length-bounded strings made strict JSON."""
    grammar = xg.Grammar.from_json_schema(schema, any_whitespace=any_whitespace)
    text = str(grammar)
    repaired = text.replace(_BOUNDED_CHAR, _JSON_CHAR)
    if repaired == text:
        return grammar
    # The printer writes U+0080–U+00FF as \xNN, but the parser reads \x greedily ("\xe9a" is U+0E9A): \u00NN
    # reads back as written. Escapes are matched from their backslash, so an escaped backslash is skipped whole.
    return xg.Grammar.from_ebnf(_ESCAPE.sub(lambda m: "\\u00" + m[1][1:] if len(m[1]) == 3 else m[0], repaired))


def _short(e: Exception) -> str:
    """xgrammar's message without its source-location prefix."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


class Constraint:
    """One request's grammar state. Not thread-safe: used by the engine thread only."""

    def __init__(self, compiled: xg.CompiledGrammar, vocab_size: int, stop_token_ids: Sequence[int],
                 canonical: xg.CompiledGrammar | None = None, encode: Callable[[str], tuple[int, ...]] | None = None):
        """``canonical`` and ``encode`` (text → token ids) give forced tokens (``Cursor.forced``)."""
        if not stop_token_ids:
            raise GrammarError("a constrained request needs at least one stop token to end on")
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self._matcher = xg.GrammarMatcher(compiled, override_stop_tokens=self.stop_token_ids)
        self._encode = encode
        self._canonical = None  # the whitespace-free matcher while the output stays in its language
        if encode is not None:
            self._canonical = xg.GrammarMatcher(canonical or compiled, override_stop_tokens=self.stop_token_ids)
        self._bitmask = xg.allocate_token_bitmask(1, vocab_size)
        self._stop_only = torch.zeros(vocab_size, dtype=torch.bool)
        self._stop_only[self.stop_token_ids] = True

    @property
    def terminated(self) -> bool:
        """True once a stop token has been committed after a complete match: nothing more may follow."""
        return self._matcher.is_terminated()

    @property
    def completed(self) -> bool:
        """True when the committed text is a complete match (a stop token is then allowed)."""
        return self._matcher.is_completed()

    def _current_mask(self) -> torch.Tensor:
        if self._matcher.is_terminated():
            return self._stop_only.clone()
        self._matcher.fill_next_token_bitmask(self._bitmask)
        return unpack_bitmask(self._bitmask, self.vocab_size)[0]

    def mask(self) -> torch.Tensor:
        """Allowed next tokens after the committed ones: bool [V]."""
        return self._current_mask()

    @contextmanager
    def speculate(self) -> Iterator["Cursor"]:
        """A cursor that walks ahead of the committed state through draft tokens; rolled back on exit."""
        cursor = Cursor(self)
        try:
            yield cursor
        finally:
            if cursor.steps:
                self._matcher.rollback(cursor.steps)
            if cursor.canonical_steps:
                self._canonical.rollback(cursor.canonical_steps)

    @contextmanager
    def drafting(self, pending: Sequence[int]) -> Iterator["Cursor"]:
        """A cursor for proposing the next draft chain, placed after ``pending``: tokens already emitted this step
        but not committed yet (the engine drafts before it commits). Rolled back on exit."""
        with self.speculate() as cur:
            for t in pending:
                cur.advance(int(t))
            yield cur

    def verification_masks(self, draft_tokens: Sequence[int]) -> torch.Tensor:
        """Allowed tokens at each of the len(draft)+1 verified positions: bool [len(draft)+1, V].

        Row i constrains the target's token after the committed ones plus draft_tokens[:i]. Rows after a draft
        token the grammar rejects are never sampled from (verification rejects that token first, as its target
        probability is masked to zero); they are all-True so the logits stay finite.
        """
        rows = []
        with self.speculate() as cur:
            rows.append(cur.mask())
            for t in draft_tokens:
                cur.advance(int(t))
                rows.append(cur.mask())
        return torch.stack(rows)

    def commit(self, token_ids: Sequence[int]) -> None:
        """Advance the committed state through emitted tokens (they were sampled under this constraint's masks)."""
        for t in token_ids:
            if not self._matcher.accept_token(int(t)):
                raise RuntimeError(f"token {int(t)} emitted outside the grammar")
            if self._canonical is not None and not self._canonical.accept_token(int(t)):
                self._canonical = None


class Cursor:
    """Tentative position ahead of a constraint's committed state."""

    def __init__(self, owner: Constraint):
        self._owner = owner
        self.steps = 0  # tokens the matcher accepted on this cursor (rolled back on exit)
        self.canonical_steps = 0  # the same for the whitespace-free matcher
        self.dead = False  # a draft token was rejected: later positions are unreachable
        self._canonical = owner._canonical  # None once a draft token leaves the canonical language
        self._last: torch.Tensor | None = None

    def mask(self) -> torch.Tensor:
        if self.dead:
            return torch.ones(self._owner.vocab_size, dtype=torch.bool)
        self._last = self._owner._current_mask()
        return self._last

    def advance(self, token_id: int) -> bool:
        """Accept one draft token; False (and the cursor is dead) when the grammar rejects it."""
        if self.dead:
            return False
        m = self._owner._matcher
        known_bad = self._last is not None and not (0 <= token_id < len(self._last) and self._last[token_id])
        self._last = None
        if known_bad or m.is_terminated() or not m.accept_token(token_id):
            self.dead = True
            return False
        self.steps += 1
        if self._canonical is not None:
            if self._canonical.accept_token(token_id):
                self.canonical_steps += 1
            else:
                self._canonical = None
        return True

    def forced(self) -> list[int]:
        """The tokens the schema forces next, written canonically (see the module docstring); [] when none."""
        c = self._canonical
        if self.dead or c is None or c.is_terminated():
            return []
        text = c.find_jump_forward_string()
        if not text:
            return []
        ids = list(self._owner._encode(text))
        accepted = 0
        for t in ids:  # does the text end the output? (then its last token cannot merge with anything)
            if not c.accept_token(t):
                break
            accepted += 1
        ends = accepted == len(ids) and c.is_completed() and not c.find_jump_forward_string()
        if accepted:
            c.rollback(accepted)
        return ids[:accepted] if ends else ids[: min(accepted, len(ids) - 1)]

