"""The compiled kernels (numba, the ``fast`` extra) behind the analysis and the exact bonus, for
benchmarks that time them against a baseline: each has a NumPy path that gives the same results
(bit for bit where ``tests/math/test_kernels.py`` says so). ``HAVE_NUMBA`` says whether they compile."""

from ._math._gamma_kernels import exact_closed_gamma, exact_kl_gamma
from ._math._jit import HAVE_NUMBA, set_threads
from ._math._kernels import warm_up, windowed_accepted_length, windowed_accepted_length_of_ratio

__all__ = [
    "HAVE_NUMBA",
    "exact_closed_gamma",
    "exact_kl_gamma",
    "set_threads",
    "warm_up",
    "windowed_accepted_length",
    "windowed_accepted_length_of_ratio",
]
