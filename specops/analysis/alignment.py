"""Tokens onto the answer's characters, and a class and field for every token.

A character belongs to the token whose decoding completes it: the text of the first i + 1 tokens, less a trailing
unfinished UTF-8 sequence (U+FFFD), is the text up to token i, so a byte-level piece of a Chinese character that
completes nothing has an empty span and takes the class of the character it starts. Special tokens (EOS) decode to
nothing and have the class ``end``.

Straddling: a token whose characters have several classes takes the class (and field) of its first character
that is not whitespace; a token of whitespace only is ``whitespace``. So ``":`` is a quote, ``, "`` punctuation and
`` 80`` a number.
"""

from __future__ import annotations

from specops.analysis.json_lexer import label

END = "end"


def spans(tokenizer, token_ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """(decoded text, [start, end) character span per token)."""
    ends, text = [], ""
    for i in range(len(token_ids)):
        text = tokenizer.decode(token_ids[: i + 1], skip_special_tokens=True)
        ends.append(len(text.rstrip("\ufffd")))
    full = tokenizer.decode(token_ids, skip_special_tokens=True) if token_ids else ""
    out, prev = [], 0
    for e in ends:
        e = max(e, prev)
        out.append((prev, e))
        prev = e
    return full, out


def token_classes(tokenizer, token_ids: list[int]) -> list[tuple[str, str | None]]:
    """(class, field) per token of an answer."""
    text, token_spans = spans(tokenizer, token_ids)
    classes, fields = label(text)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out = []
    for tok, (a, b) in zip(token_ids, token_spans):
        if tok in special:
            out.append((END, None))
            continue
        if a == b:  # completes no character: the one it starts
            out.append((classes[a], fields[a]) if a < len(classes) else ("text", None))
            continue
        k = next((k for k in range(a, b) if classes[k] != "whitespace"), None)
        out.append((classes[k], fields[k]) if k is not None else ("whitespace", None))
    return out
