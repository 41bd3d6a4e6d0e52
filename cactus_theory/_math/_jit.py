"""numba, when it is installed (``pip install cactus_theory[fast]``): whether it is (``HAVE_NUMBA``), the
decorator every kernel is compiled with (``_jit``: cached on disk beside the module, so later processes load
the machine code), and the process settings the kernels run under (threads, the allocator)."""

from __future__ import annotations

try:  # pragma: no cover - depends on the environment
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    numba = None
    HAVE_NUMBA = False

__all__ = ["HAVE_NUMBA", "PARALLEL_MIN", "keep_freed_memory", "set_threads"]

#: Elements from which a kernel with a parallel loop runs on every core. Below, its serial twin runs (the same
#: arithmetic element by element: the same bits): a parallel kernel costs about 1.6 s more to compile, which a
#: first run pays, and saves under 8 ms per call below this size on two cores.
PARALLEL_MIN = 65_536


def _jit(fn):
    if not HAVE_NUMBA:
        return None
    return numba.njit(cache=True, nogil=True, fastmath=False)(fn)


class _Split:
    """A kernel whose loop over elements is ``numba.prange``: a serial and a parallel compilation of it, each
    compiled (or loaded from the on-disk cache) the first time it is called, the parallel one from
    ``PARALLEL_MIN`` elements on. Both use NumPy's error model (a float division by zero gives inf, never
    raises), as a parallel kernel does."""

    def __init__(self, fn):
        self.serial = numba.njit(cache=True, nogil=True, error_model="numpy")(fn)
        self.parallel = numba.njit(cache=True, nogil=True, parallel=True)(fn)

    def __call__(self, size, *args):
        return self.run(size >= PARALLEL_MIN, *args)

    def run(self, parallel, *args):
        """The parallel compilation when ``parallel``, else the serial one (a caller with its own measure)."""
        return (self.parallel if parallel else self.serial)(*args)


def _jit_split(fn):
    """``_Split`` of ``fn`` (None without numba)."""
    return _Split(fn) if HAVE_NUMBA else None


def keep_freed_memory():
    """Ask glibc's malloc to serve arrays below 64 MiB from its heap and keep up to 128 MiB of
    freed memory (``mallopt``). A Dask nanny starts its workers with MALLOC_TRIM_THRESHOLD_ =
    65536, which pins the mmap threshold at 128 KiB: every array above it is mapped fresh and
    page-faulted, and the analysis ran 1.6x slower in such a worker (a shard: 0.45 s against
    0.29 s after this call). Only for worker processes this package starts; returns whether it
    applied (False off glibc)."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 64 << 20)) and bool(mallopt(m_trim_threshold, 128 << 20))


def set_threads(threads):
    """Threads of the parallel kernels (numba) and of torch in this process."""
    if HAVE_NUMBA:
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(max(1, int(threads)))
