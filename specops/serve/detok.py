"""Incremental detokenization with stop strings, the way vLLM's output processor behaves.

Text is re-decoded from all ids each step (byte-level BPE pieces of one character can span tokens), a trailing
U+FFFD (an unfinished UTF-8 sequence) is held back, and so are the last len(stop)-1 characters that could
still begin a stop string. A matched stop string ends the output; it is not included in the text.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stops: list[str]):
        self._tok = tokenizer
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self.token_ids: list[int] = []
        self._sent = 0  # characters already returned
        self.stopped = False  # a stop string was found

    def _text(self) -> str:
        return self._tok.decode(self.token_ids, skip_special_tokens=True)

    def add(self, new_ids: list[int], final: bool = False) -> str:
        """Append ids; return the newly settled text (everything left when ``final``)."""
        self.token_ids.extend(new_ids)
        text = self._text()
        for s in self._stops:
            at = text.find(s, max(0, self._sent - len(s) + 1))
            if at != -1:
                text, final, self.stopped = text[:at], True, True
        if not final:
            settled = len(text) - self._hold
            while settled > self._sent and text[settled - 1] == "\ufffd":
                settled -= 1
            text = text[: max(settled, self._sent)]
        out, self._sent = text[self._sent :], max(self._sent, len(text))
        return out
