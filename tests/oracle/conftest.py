"""The oracle wing's tests: fakes with a known law (``spec_fakes``), local servers (``tests/servers/local_servers``),
the shared tiny GGUF pair and llama-server binary (``tests/conftest.py``)."""

import pathlib
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "servers"))
sys.path.insert(0, str(HERE))
