"""A test's code run in a fresh interpreter (what a user's own process sees: no rule registered by an
earlier test, no module already imported)."""

import subprocess
import sys
import textwrap

from locations import HANG_GUARD


def run_with_module(tmp_path, module_text, code):
    """Write ``module_text`` as ``broken_rules.py`` in ``tmp_path``, run ``code`` (dedented) there in a fresh
    interpreter, assert it exits 0 (else its stderr's end is the message) and return its stdout."""
    (tmp_path / "broken_rules.py").write_text(module_text)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
