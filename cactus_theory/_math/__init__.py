"""Mathematics with no notion of a rule: the array backend (NumPy / torch), input validation,
double-double arithmetic, compiled kernels, f-divergences and their symbolic forms, the Cactus
bonus gamma, the Cactus surrogate, sampling settings, synthetic (p, q) pairs, Pareto fronts, the
bootstrap, and raw logits (``RuleLogits``). Imports nothing of the package: it stands at the bottom, beside
``_util``."""
