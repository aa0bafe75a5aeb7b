"""Incremental detokenization with stop strings, the way vLLM's output processor behaves.

Each step decodes only a short window of ids, not the whole output again (that made every streamed token cost
time proportional to the output's length): the new ids together with the few before them, so a piece whose
text depends on its left neighbour (a leading space, a UTF-8 sequence split over byte-level BPE pieces) comes
out as it does in the full decode. Ids whose text ends in U+FFFD (an unfinished UTF-8 sequence) wait for the
next ones, and so do the last len(stop)-1 characters that could still begin a stop string. A matched stop
string ends the output; it is not included in the text.

A fast tokenizer decodes through its Rust backend directly: the transformers wrapper costs more than the
decode itself, and the server pays it once per request per step.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stops: list[str]):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            self._decode_ids = lambda ids: backend.decode(ids, skip_special_tokens=True)
        else:  # a slow tokenizer, or one whose wrapper post-processes the text
            self._decode_ids = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self.token_ids: list[int] = []
        self._text = ""  # the text of token_ids[:_read]
        self._prefix = 0  # ids [_prefix, _read) are decoded again with the new ones, as their left context
        self._read = 0
        self._sent = 0  # characters already returned
        self.stopped = False  # a stop string was found

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._decode_ids(self.token_ids[start:end])

    def _extend(self, final: bool) -> None:
        """Add the text of the ids after ``_read`` unless it ends mid-character (taken anyway when ``final``)."""
        if self._read == len(self.token_ids):
            return
        before = self._decode(self._prefix, self._read)
        window = self._decode(self._prefix)
        if len(window) > len(before) and (final or not window.endswith("\ufffd")):
            self._text += window[len(before):]
            self._prefix, self._read = self._read, len(self.token_ids)

    def add(self, new_ids: list[int], final: bool = False) -> str:
        """Append ids; return the newly settled text (everything left when ``final``)."""
        self.token_ids.extend(new_ids)
        self._extend(final)
        text = self._text
        for s in self._stops:
            at = text.find(s, max(0, self._sent - len(s) + 1))
            if at != -1:
                text, final, self.stopped = text[:at], True, True
        if not final:
            text = text[: max(len(text) - self._hold, self._sent)]
        out, self._sent = text[self._sent :], max(self._sent, len(text))
        return out
