"""Files written the way the package writes them, for scripts and extensions: atomic writes
(a temporary name, then a rename), CSV text, UTF-8 reading with clear errors, directory locks,
output locations checked before the work; the time a study's runs spent, read from its records (``run_seconds``).
The guarantees: ``cactus_theory._util._files``."""

from ._util import _files
from ._util._files import *  # noqa: F403 (the files the package writes, as it writes them)
from ._util._study import run_seconds

#: What of ``_util._files`` stays the package's own.
_OWN = ("pid_alive", "publish_directory", "refuse_overlap", "remove_stale_temporaries", "utc_timestamp")
__all__ = [*(name for name in _files.__all__ if name not in _OWN), "run_seconds"]
