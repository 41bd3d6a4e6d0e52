"""A trace to statistics and decisions: the analysis (typed per-sequence records, one bootstrap),
where it runs (engines), what it writes, the figures, the cost model and the planner. Imports
``_data``, ``_laws``, ``_rules``, ``_math``, ``_util``; never torch."""
