import glob
import importlib.util
import json
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Plugins the tests give to fresh interpreters only: importing them here (doctest collection imports
#: every module) would register their rule or protocol in every test of this process.
collect_ignore = ["rules/block_sps_plugin.py", "servers/toy_protocol.py", "data/toy_benchmark.py"]


@pytest.fixture(autouse=True, scope="session")
def _private_model_cache(tmp_path_factory):
    """Tests never write into the user's cache (dequantised GGUF models land in a temporary one)."""
    os.environ["CACTUS_THEORY_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield


#: Markers of tests that need an optional dependency: (module, the extra that installs it).
OPTIONAL = {
    "torch": ("torch", "models"),
    "models": ("transformers", "models"),
    "fast": ("numba", "fast"),
    "distributed": ("distributed", "distributed"),
    "llamacpp": ("llama_cpp", "llamacpp"),
    "servers": ("httpx", "servers"),
    "sandbox": ("pyseccomp", "sandbox"),
}


def pytest_collection_modifyitems(config, items):
    """Tests marked with an optional dependency that is not installed are skipped, with the reason
    and the extra to install; in CI (CI=true) nothing is skipped: a missing dependency fails."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return
    missing = {m: v for m, v in OPTIONAL.items() if importlib.util.find_spec(v[0]) is None}
    if any(item.get_closest_marker("isolation") for item in items):
        from cactus_theory._util._isolation import isolation_status

        status = isolation_status()
        if not status.available:
            for item in items:
                if item.get_closest_marker("isolation"):
                    item.add_marker(pytest.mark.skip(reason=f"no OS isolation here: {status.reason}"))
    for item in items:
        for marker, (module, extra) in missing.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=f"needs {module}: pip install -e '.[{extra}]'"))


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    """Two tiny GGUF models (a verifier and a one-layer draft) on disk: the llama.cpp and GGUF paths' tests."""
    from tiny_models import tiny_model, write_tiny_gguf

    d = tmp_path_factory.mktemp("models")
    return str(write_tiny_gguf(tiny_model(4), d / "verifier.gguf")), str(
        write_tiny_gguf(tiny_model(5, layers=1), d / "draft.gguf")
    )


@pytest.fixture(scope="module")
def own_prompts(tmp_path_factory):
    """A user's own prompt file (JSON Lines, field ``instruction``) of four short prompts."""
    path = tmp_path_factory.mktemp("prompts") / "my_prompts.jsonl"
    path.write_text("".join(json.dumps({"instruction": t}) + "\n" for t in ("ab cd", "ef gh ab", "cd ef", "gh")))
    return str(path)


@pytest.fixture
def mixed_prompt_file(tmp_path):
    """A user's prompt file (JSON Lines) mixing tasks: two "math" prompts, one "chat", one without a task."""
    path = tmp_path / "mine.jsonl"
    rows = [
        {"prompt": "add two and two", "task": "math"},
        {"prompt": "say hello", "task": "chat"},
        {"prompt": "add three and four", "task": "math"},
        {"prompt": "no task here"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def llama_server_binary() -> str | None:
    """The llama-server to test with: ``$CACTUS_LLAMA_SERVER`` (``scripts/check.sh`` builds it with
    ``scripts/build_llama_server.py`` and exports it), else the build script's cache; or None. Without one the
    tests that need it are skipped, except in CI (CI=true), where they fail."""
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
    """(verifier, draft) GGUF files of two tiny random Qwen2 models sharing a 64-token BPE vocabulary: the servers'
    and the oracle's tests."""
    pytest.importorskip("gguf") if not _in_ci() else None
    from tiny_models import tiny_model, write_tiny_gguf

    d = tmp_path_factory.mktemp("ggufs")
    return write_tiny_gguf(tiny_model(seed=0), d / "verifier.gguf"), write_tiny_gguf(
        tiny_model(seed=1, layers=1), d / "draft.gguf"
    )
