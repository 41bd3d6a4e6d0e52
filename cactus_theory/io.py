"""Files written the way the package writes them, for scripts and extensions: atomic writes
(a temporary name, then a rename), CSV text, UTF-8 reading with clear errors, directory locks,
output locations checked before the work; the time a study's runs spent, read from its records (``run_seconds``).
The guarantees: ``cactus_theory._util._files``."""

from ._util._files import (
    DirectoryLock,
    LockError,
    atomic_path,
    atomic_write,
    check_output,
    csv_text,
    json_lines,
    machine_description,
    read_text,
    sha256_file,
    termination_as_exception,
    write_records,
    write_results,
)
from ._util._study import run_seconds

__all__ = [
    "DirectoryLock",
    "LockError",
    "atomic_path",
    "atomic_write",
    "check_output",
    "csv_text",
    "json_lines",
    "machine_description",
    "read_text",
    "run_seconds",
    "sha256_file",
    "termination_as_exception",
    "write_records",
    "write_results",
]
