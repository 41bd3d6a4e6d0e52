"""Hypothesis strategies shared by the tests: probabilities and budgets with their edges."""

import numpy as np
from hypothesis import strategies as st

EDGE_PROBS = [0.0, 5e-324, 1e-300, 1e-12, 1e-6, 0.5, 1 - 1e-6, 1 - 1e-12, float(np.nextafter(1, 0)), 1.0]

probabilities = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from(EDGE_PROBS),
    st.floats(-300, 0).map(lambda e: 10.0**e),
    st.floats(-15, -0.01).map(lambda e: 1.0 - 10.0**e),
)
interior_probabilities = st.floats(1e-9, 1 - 1e-9)
budgets = st.one_of(
    st.floats(0.0, 20.0),
    st.floats(-15, 2).map(lambda e: 10.0**e),
    st.sampled_from([0.0, 1e-300, 1e-12, 0.75, 1.0, 1e3, float("inf")]),
)
