"""Where each key of a TOML document is written: the line of every key path.

:mod:`tomllib` gives values but no positions, so a profile error could only point at a
table's header. This scanner reads a document ``tomllib`` has already accepted and records,
for every key path (``("contract", "state_rules", 2, "category")``: names, and indices of
array elements and of ``[[array of tables]]`` entries), the line it starts on. It assumes
valid TOML and never judges it.

The helpers below it turn a :class:`msgspec.ValidationError` about such a document into the
key path it names and the nearest valid word, for bide.toml (:mod:`daemon.config`) and for
provider profiles (:mod:`daemon.profile`) alike.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
from typing import Annotated, Union, get_args, get_origin, get_type_hints

import msgspec

KeyPath = tuple[str | int, ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = re.compile(r"[,\]}\n#]")


def key_lines(text: str) -> dict[KeyPath, int]:
    """Every key path of ``text`` (already valid TOML) and the line (from 1) it starts on."""
    return _Scanner(text).scan()


def nearest(word: str, choices: tuple[str, ...]) -> str:
    """``; did you mean 'x'?`` for the choice closest to ``word``, else the list of choices."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f" (one of {', '.join(choices)})"


def unwrap(tp: object) -> object:
    """A declared type without its ``Annotated[...]`` and ``| None``: ``X``."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def type_at(root: type, keys: KeyPath, read_as: dict[str, type] | None = None) -> object:
    """The declared type of the value at ``keys`` under the struct ``root`` (None where none
    is declared). ``read_as`` names root tables declared loosely but read by a struct of their
    own (a profile's ``contract``, a dict until :class:`replay.contract.Contract` reads it)."""
    tp: object = root
    for key in keys:
        tp = unwrap(tp)
        if tp is root and read_as and isinstance(key, str) and key in read_as:
            tp = read_as[key]
        elif isinstance(key, int):
            args = get_args(tp)
            tp = args[0] if args else None
        elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            tp = get_type_hints(tp, include_extras=True).get(key)
        else:
            return None
    return unwrap(tp)


def fields_at(root: type, keys: KeyPath, read_as: dict[str, type] | None = None) -> tuple[str, ...]:
    """The keys a table at ``keys`` may hold (none when it is not a struct)."""
    tp = type_at(root, keys, read_as)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tuple(tp.__struct_fields__)
    return ()


def dotted(keys: KeyPath) -> str:
    """``("contract", "results", 0, "kind")`` as ``contract.results[1].kind`` (from 1)."""
    return "".join(f"[{k + 1}]" if isinstance(k, int) else f".{k}" for k in keys).lstrip(".")


_MSGSPEC_PATH = re.compile(r"(?: - )?at `\$((?:\.[A-Za-z0-9_]+|\[\d+\])*)`")
_MSGSPEC_STEP = re.compile(r"\.([A-Za-z0-9_]+)|\[(\d+)\]")


def msgspec_place(message: str) -> tuple[KeyPath, str]:
    """The key path a msgspec validation message names (``... - at `$.a[0].b` ``; none for
    the document's top level) and the message without it."""
    m = _MSGSPEC_PATH.search(message)
    if not m:
        return (), message
    keys: KeyPath = tuple(
        name if name else int(index) for name, index in _MSGSPEC_STEP.findall(m.group(1))
    )
    return keys, message[: m.start()]


#: msgspec's type names in words.
TYPE_WORDS = {
    "str": "a string in quotes",
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "array": "a list [...]",
    "object": "a table",
}


def type_in_words(detail: str, shown: str) -> str | None:
    """msgspec's ``Expected `int`, got `str` `` or ``Expected `int` >= 1`` in words, with
    ``shown`` (the value as written) for a bound; None for any other message."""
    if found := re.match(r"Expected `(\w+)`, got `(\w+)`$", detail):
        want, got = found.groups()
        return f"must be {TYPE_WORDS.get(want, want)}, got {TYPE_WORDS.get(got, got)}"
    if found := re.match(r"Expected `(\w+)` ([<>]=? \S+)$", detail):
        want, bound = found.groups()
        return f"must be {TYPE_WORDS.get(want, want)} {bound}, got {shown}"
    return None


def line_of(lines: dict[KeyPath, int], path: KeyPath) -> int:
    """The line of ``path``, else of its nearest enclosing key written in the file (0: none)."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 0


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.lines: dict[KeyPath, int] = {}
        self.arrays: dict[KeyPath, int] = {}  # [[array of tables]] path -> entries so far

    @property
    def line(self) -> int:
        return self.text.count("\n", 0, self.pos) + 1

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def skip(self, newlines: bool) -> None:
        """Skip blanks and comments (and newlines when ``newlines``)."""
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            elif c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def note(self, path: KeyPath, line: int) -> None:
        self.lines.setdefault(path, line)

    def scan(self) -> dict[KeyPath, int]:
        current: KeyPath = ()
        while True:
            self.skip(newlines=True)
            if self.pos >= len(self.text):
                return self.lines
            line = self.line
            if self.peek(2) == "[[":
                self.pos += 2
                current = self.header(self.dotted_key(), line, array=True)
                self.pos = self.text.index("]]", self.pos) + 2
            elif self.peek() == "[":
                self.pos += 1
                current = self.header(self.dotted_key(), line, array=False)
                self.pos = self.text.index("]", self.pos) + 1
            else:
                self.key_value(current)

    def header(self, keys: list[str], line: int, array: bool) -> KeyPath:
        resolved: KeyPath = ()
        for n, key in enumerate(keys):
            resolved = (*resolved, key)
            if array and n == len(keys) - 1:
                self.arrays[resolved] = self.arrays.get(resolved, 0) + 1
            if resolved in self.arrays:
                self.note(resolved, line)
                resolved = (*resolved, self.arrays[resolved] - 1)
            self.note(resolved, line)
        return resolved

    def key_value(self, table: KeyPath) -> None:
        line = self.line
        keys = self.dotted_key()
        for end in range(1, len(keys) + 1):  # a.b = 1 also writes table a
            self.note((*table, *keys[:end]), line)
        path = (*table, *keys)
        self.skip(newlines=False)
        self.pos += 1  # "="
        self.value(path)

    def dotted_key(self) -> list[str]:
        keys = []
        while True:
            self.skip(newlines=False)
            keys.append(self.simple_key())
            self.skip(newlines=False)
            if self.peek() != ".":
                return keys
            self.pos += 1

    def simple_key(self) -> str:
        c = self.peek()
        if c in "\"'":
            raw = self.string()
            return str(tomllib.loads(f"k = {raw}")["k"])
        match = _BARE_KEY.match(self.text, self.pos)
        assert match is not None, "the document was valid TOML"
        self.pos = match.end()
        return match.group()

    def string(self) -> str:
        """Consume a string of any of TOML's four forms; return its source text."""
        start = self.pos
        quote = self.peek()
        if self.peek(3) == quote * 3:
            end = self.text.index(quote * 3, self.pos + 3)
            while quote == '"' and _escaped(self.text, end):
                end = self.text.index(quote * 3, end + 1)
            end += 3
            while self.text[end : end + 1] == quote:  # up to two quotes may close the content
                end += 1
        else:
            end = self.pos + 1
            while self.text[end] != quote:
                end += 2 if quote == '"' and self.text[end] == "\\" else 1
            end += 1
        self.pos = end
        return self.text[start:end]

    def value(self, path: KeyPath) -> None:
        self.skip(newlines=False)
        c = self.peek()
        if c == "[":
            self.pos += 1
            index = 0
            while True:
                self.skip(newlines=True)
                if self.peek() == "]":
                    self.pos += 1
                    return
                self.note((*path, index), self.line)
                self.value((*path, index))
                self.skip(newlines=True)
                if self.peek() == ",":
                    self.pos += 1
                index += 1
        elif c == "{":
            self.pos += 1
            while True:
                self.skip(newlines=True)
                if self.peek() == "}":
                    self.pos += 1
                    return
                if self.peek() == ",":
                    self.pos += 1
                    continue
                self.key_value(path)
        elif c in "\"'":
            self.string()
        else:
            match = _SCALAR_END.search(self.text, self.pos)
            self.pos = match.start() if match else len(self.text)


def _escaped(text: str, at: int) -> bool:
    backslashes = 0
    while at - backslashes - 1 >= 0 and text[at - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1
