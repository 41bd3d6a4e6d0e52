"""The servers wing's fixtures: llama.cpp's own ``llama-server`` pair started on 127.0.0.1 with the tiny GGUF test
models (a free port, never outliving its test module) and the prompts the dumps read. The servers themselves are
in ``local_servers``; the binary and the tiny GGUF pair they need are shared fixtures (``tests/conftest.py``)."""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

from local_servers import llama_server  # noqa: E402


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
