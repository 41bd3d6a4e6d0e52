"""The servers wing's fixtures, all of them here: llama.cpp's own ``llama-server`` pair started on 127.0.0.1
with the tiny GGUF test models (a free port, never outliving its test module), the binary and the models
they need, and the prompts the dumps read. The servers themselves are in ``local_servers``.

The llama-server binary: ``$CACTUS_LLAMA_SERVER`` (``scripts/check.sh`` builds it with
``scripts/build_llama_server.py`` and exports it), else the build script's cache. Without one the tests
that need it are skipped, except in CI (CI=true), where they fail."""

from __future__ import annotations

import glob
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

from local_servers import llama_server  # noqa: E402


def llama_server_binary() -> str | None:
    """The llama-server to test with, or None."""
    found = os.environ.get("CACTUS_LLAMA_SERVER")
    if found:
        return found if os.access(found, os.X_OK) else None
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates = sorted(glob.glob(os.path.join(home, "cactus_theory", "llama-server", "*", "llama-server")))
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def server_binary():
    binary = llama_server_binary()
    if binary is None:
        message = "needs llama-server: python scripts/build_llama_server.py (scripts/check.sh runs it)"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def tiny_ggufs(tmp_path_factory):
    """(verifier, draft) GGUF files of two tiny random Qwen2 models sharing a 64-token BPE vocabulary."""
    pytest.importorskip("gguf") if not _in_ci() else None
    from tiny_models import tiny_model, write_tiny_gguf

    d = tmp_path_factory.mktemp("ggufs")
    return write_tiny_gguf(tiny_model(seed=0), d / "verifier.gguf"), write_tiny_gguf(
        tiny_model(seed=1, layers=1), d / "draft.gguf"
    )


@pytest.fixture(scope="module")
def llama_pair(server_binary, tiny_ggufs, tmp_path_factory):
    """Two llama-servers (verifier, draft), one slot each, for the module's tests."""
    logs = tmp_path_factory.mktemp("server-logs")
    with (
        llama_server(server_binary, tiny_ggufs[0], "-np", "1", "-c", "256", log_dir=logs) as verifier,
        llama_server(server_binary, tiny_ggufs[1], "-np", "1", "-c", "256", log_dir=logs) as draft,
    ):
        yield verifier, draft


@pytest.fixture
def prompts(tmp_path):
    """Three short prompts (a plain text file: one a line)."""
    from cactus_theory._data._prompts import load_prompts

    path = tmp_path / "prompts.txt"
    path.write_text("hello there\nsome text\nthird one\n")
    return load_prompts(str(path))
