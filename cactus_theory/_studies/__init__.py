"""Studies built on the analysis: every rule at the paper grid (zoo), multi-draft and tree
verification against the optimum, block verification against token rules, and the report.
Imports the wings below; never torch directly."""
