import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


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
}


def pytest_collection_modifyitems(config, items):
    """Tests marked with an optional dependency that is not installed are skipped, with the reason
    and the extra to install; in CI (CI=true) nothing is skipped: a missing dependency fails."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return
    missing = {m: v for m, v in OPTIONAL.items() if importlib.util.find_spec(v[0]) is None}
    for item in items:
        for marker, (module, extra) in missing.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=f"needs {module}: pip install -e '.[{extra}]'"))
