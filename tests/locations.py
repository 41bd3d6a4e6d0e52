"""Where the tests find things, wherever a test file sits below ``tests/``: the repository, the
tests' own folder (its helper modules: a child process needs it on PYTHONPATH) and the fixtures."""

import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"

#: How long a test waits on a subprocess before calling it stuck: a guard against a hang, never a budget for the
#: work (a test waits for an event: the child's exit, a line it prints, a file; a busy machine only delays it).
HANG_GUARD = 3600
