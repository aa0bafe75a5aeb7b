"""Label every character of a model's answer with its JSON role and, inside the object, its schema field.

Classes: ``punct`` (structural ``{ } [ ] : ,``), ``quote`` (the ``"`` around keys and string values), ``whitespace``
(between tokens of the JSON), ``key`` (a key's characters), ``string`` (a string value's characters, escapes
included), ``number``, ``literal`` (``true``/``false``/``null``), and ``text`` (everything outside the first JSON
object: chatter before it, anything after it, and the rest of the answer from the first character that is not
valid JSON). Fields are paths: ``price_max``, ``brands[]``, ``a.b`` for nested objects; a key's characters, its
quotes and its value's characters (quotes included) carry the field; punctuation and whitespace carry none.
"""

from __future__ import annotations

CLASSES = ("punct", "quote", "whitespace", "key", "string", "number", "literal", "text")
SCHEMA = ("punct", "quote", "key")  # what the schema fixes: structure, quotes, key names
WS = " \t\n\r"


class _Invalid(Exception):
    pass


def label(text: str) -> tuple[list[str], list[str | None]]:
    """(class per character, field path per character)."""
    classes = ["text"] * len(text)
    fields: list[str | None] = [None] * len(text)
    start = text.find("{")
    if start < 0:
        return classes, fields
    lexer = _Lexer(text, classes, fields)
    try:
        lexer.value(start, None)
    except _Invalid:
        pass  # everything from the failing character on stays "text"
    return classes, fields


class _Lexer:
    def __init__(self, text: str, classes: list[str], fields: list[str | None]):
        self.t, self.c, self.f = text, classes, fields

    def _set(self, i: int, j: int, cls: str, field: str | None = None) -> None:
        for k in range(i, j):
            self.c[k], self.f[k] = cls, field

    def ws(self, i: int) -> int:
        j = i
        while j < len(self.t) and self.t[j] in WS:
            j += 1
        self._set(i, j, "whitespace")
        return j

    def expect(self, i: int, ch: str) -> int:
        if i >= len(self.t) or self.t[i] != ch:
            raise _Invalid
        self._set(i, i + 1, "punct")
        return i + 1

    def value(self, i: int, field: str | None) -> int:
        i = self.ws(i)
        if i >= len(self.t):
            raise _Invalid
        ch = self.t[i]
        if ch == "{":
            return self.obj(i, field)
        if ch == "[":
            return self.arr(i, field)
        if ch == '"':
            return self.string(i, "string", field)
        for lit in ("true", "false", "null"):
            if self.t.startswith(lit, i):
                self._set(i, i + len(lit), "literal", field)
                return i + len(lit)
        return self.number(i, field)

    def obj(self, i: int, parent: str | None) -> int:
        i = self.expect(i, "{")
        i = self.ws(i)
        if i < len(self.t) and self.t[i] == "}":
            return self.expect(i, "}")
        while True:
            i = self.ws(i)
            key_start = i
            i = self.string(i, "key", None)
            name = self.t[key_start + 1 : i - 1]
            path = f"{parent}.{name}" if parent else name
            self._set(key_start, i, "key", path)
            self.c[key_start] = self.c[i - 1] = "quote"
            i = self.expect(self.ws(i), ":")
            i = self.ws(self.value(i, path))
            if i < len(self.t) and self.t[i] == ",":
                i = self.expect(i, ",")
                continue
            return self.expect(i, "}")

    def arr(self, i: int, field: str | None) -> int:
        i = self.expect(i, "[")
        item = f"{field}[]" if field else "[]"
        i = self.ws(i)
        if i < len(self.t) and self.t[i] == "]":
            return self.expect(i, "]")
        while True:
            i = self.ws(self.value(i, item))
            if i < len(self.t) and self.t[i] == ",":
                i = self.expect(i, ",")
                continue
            return self.expect(i, "]")

    def string(self, i: int, cls: str, field: str | None) -> int:
        if i >= len(self.t) or self.t[i] != '"':
            raise _Invalid
        j = i + 1
        while j < len(self.t) and self.t[j] != '"':
            if self.t[j] == "\\":
                j += 1
            elif self.t[j] < " ":
                raise _Invalid  # a raw control character is not JSON
            j += 1
        if j >= len(self.t):
            raise _Invalid
        self._set(i + 1, j, cls, field)
        self._set(i, i + 1, "quote", field)
        self._set(j, j + 1, "quote", field)
        return j + 1

    def number(self, i: int, field: str | None) -> int:
        j = i
        while j < len(self.t) and (self.t[j].isdigit() or self.t[j] in "+-.eE"):
            j += 1
        if j == i:
            raise _Invalid
        try:
            float(self.t[i:j])
        except ValueError:
            raise _Invalid from None
        self._set(i, j, "number", field)
        return j
