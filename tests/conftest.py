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
