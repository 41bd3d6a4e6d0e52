"""The command-line interface, ``cactus-theory`` / ``python -m cactus_theory``: one module per
command (its arguments beside its code). The top layer: imports any wing."""

from ._main import main

__all__ = ["main"]
