"""The checks wing: the conformance machinery every rule passes (``check_rule`` and its named checks,
``_conformance``; those of block and multi-draft rules, ``_blocks``; the random cases and assertions
they share, ``_tools``) and the contract every study keeps (``check_study``, ``_studies``), whose public face is
``cactus_theory.testing``.

What belongs here: checks of a rule against the laws it claims, and of a study against the runner's
contract. What does not: the laws themselves
(``_laws``: the exact sequence law the checks compare with is ``_laws._sequence``). It imports
``_laws`` and the wings below it; nothing in the package imports it but ``testing``. torch is imported
only when a check compares NumPy with it.
"""
