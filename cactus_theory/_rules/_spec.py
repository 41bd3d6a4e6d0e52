"""The spec-string grammar of rules: ``name(key=value, ...)``, values coerced by a field's type
hint, lists written ``[0.9; 0.6]``, and the canonical form ``describe`` writes. A leaf: it knows no
rule."""

from __future__ import annotations

import dataclasses
import re
import types
import typing

import numpy as np

__all__ = ["coerce", "default", "fields", "format_value", "parse_spec", "quote", "same", "split_top"]


def fields(cls):
    return [f for f in dataclasses.fields(cls) if f.init]


def default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"rule parameter {f.name} needs a default")


def format_value(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    if isinstance(value, (tuple, list)):
        return "[" + ";".join(format_value(v) for v in value) + "]"
    if hasattr(value, "name") and not isinstance(value, str):  # an FDivergence
        return str(value.name)
    return str(value)


def quote(text, limit=80) -> str:
    """repr(text) for an error message, cut to ``limit`` characters (a 100 kB spec gives one line)."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit] + f"... ({len(str(text)):,} characters)"


def split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside brackets and parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in rule spec {quote(text)}")
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced brackets in rule spec {quote(text)}")
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def parse_spec(spec: str):
    """'name(key=value, ...)' -> (name, {key: raw string})."""
    text = spec.strip()
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9_-]*)\s*(?:\((.*)\))?", text, flags=re.S)
    if not m:
        raise ValueError(f"rule spec {quote(spec)} is not of the form name or name(key=value, ...)")
    name, body = m.group(1).lower().replace("_", "-"), m.group(2)
    args = {}
    if body is not None and body.strip():
        for item in split_top(body, ","):
            if "=" not in item:
                raise ValueError(f"rule spec {quote(spec)}: argument {quote(item)} must be key=value")
            key, value = (s.strip() for s in item.split("=", 1))
            if key in args:
                raise ValueError(f"rule spec {quote(spec)}: {key[:40]} is given twice")
            args[key] = value
    return name, args


def coerce(raw, hint, name: str, spec: str):
    """A parameter value from its spec-string text, by the field's type hint."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip().strip("'\"")
    options = (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )
    if type(None) in options and text.lower() in ("none", "null", ""):
        return None
    for option in options:
        origin = typing.get_origin(option) or option
        try:
            if origin is tuple:
                inner = (typing.get_args(option) or (float,))[0]
                body = text[1:-1] if len(text) >= 2 and (text[0], text[-1]) in (("[", "]"), ("(", ")")) else text
                if any(c in body for c in "[]()"):
                    raise ValueError(
                        f"rule spec {quote(spec)}: {name}={quote(raw)} nests lists; a list parameter is one flat "
                        "list, e.g. [0.9; 0.6; 0.3]"
                    )
                items = [s for s in re.split(r"[;,\s]+", body) if s]
                return tuple(inner(s) for s in items)
            if origin is bool:
                if text.lower() in ("true", "1", "yes"):
                    return True
                if text.lower() in ("false", "0", "no"):
                    return False
                continue
            if origin is int:
                return int(text)
            if origin is float:
                return float(text)
            if origin is str:
                return text
        except ValueError as exc:
            if "nests lists" in str(exc):
                raise
            continue
    raise ValueError(f"rule spec {quote(spec)}: {name}={quote(raw)} is not {kind_of_hint(hint)}")


def kind_of_hint(hint) -> str:
    """What a parameter's type hint asks for, in words: "a number", "an integer", "true or false"..."""
    options = (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )
    words = []
    for option in options:
        origin = typing.get_origin(option) or option
        word = {float: "a number", int: "an integer", bool: "true or false", str: "a string", type(None): "none"}.get(
            origin
        )
        if origin is tuple:
            word = "a list of numbers such as [0.9; 0.6]"
        words.append(word or str(option))
    return " or ".join(dict.fromkeys(words))


def same(a, b) -> bool:
    if hasattr(a, "name") and not isinstance(a, str):
        a = a.name
    if hasattr(b, "name") and not isinstance(b, str):
        b = b.name
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)):
        return float(a) == float(b)
    return a == b
