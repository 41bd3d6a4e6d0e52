"""Optional dependencies in the tests: ``torch`` here is the torch module, imported on first use,
so that a test module whose NumPy tests need no torch can be collected without it. Tests that
use it carry ``@pytest.mark.torch`` (conftest.py skips them, with the extra to install, when
torch is absent, and never in CI, where everything is installed)."""

import importlib


class LazyModule:
    def __init__(self, name):
        self._name = name
        self._module = None

    def __getattr__(self, attr):
        if attr.startswith("__") and attr != "__version__":  # introspection (doctest, pytest) imports nothing
            raise AttributeError(attr)
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


torch = LazyModule("torch")
