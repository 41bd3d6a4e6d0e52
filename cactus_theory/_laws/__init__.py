"""What rules do over a position and a block: the emitted law and its drift (``step_metrics``),
accepted lengths of every kind of rule (one dispatch, ``accepted_lengths``), simulation, drafting
policies, and the worst case Gamma(delta). Imports ``_rules``, ``_math``, ``_util``."""
