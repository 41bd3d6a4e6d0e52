#!/usr/bin/env bash
# Set up a fresh virtual environment and run everything a reviewer runs: lint, tests, doctests,
# and the docs site (Sphinx, warnings as errors; it executes the notebooks and the pages' code).
# Usage: bash scripts/check.sh            (from the repository root; .venv is created if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints-ci.txt -e ".[dev,models,docs,fast,distributed]"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache  # the wings' contract (pyproject.toml [tool.importlinter])
.venv/bin/python -m pytest -n 2 -q
.venv/bin/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
