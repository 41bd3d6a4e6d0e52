#!/usr/bin/env bash
# Set up a fresh virtual environment and run everything a reviewer runs: lint, tests, doctests,
# and the docs site (Sphinx, warnings as errors; it executes the notebooks and the pages' code).
# Usage: bash scripts/check.sh            (from the repository root; .venv is created if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# llama-cpp-python is a source distribution: build its library only (no llava, tools, tests or
# examples), on every core, with portable CPU kernels (a native build on x86-64 with AVX-512 and AMX
# crashes on quantised models); pip caches the wheel, so a second run takes seconds
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
.venv/bin/python -m pip install --quiet -c constraints-ci.txt -e ".[dev,models,docs,fast,distributed,llamacpp,servers,sandbox]"
# llama.cpp's own HTTP server, from the llama.cpp sources of the llama-cpp-python just installed: built once
# (about 7 minutes on two cores), then found in the user's cache in a second; the server tests start it
CACTUS_LLAMA_SERVER="$(.venv/bin/python scripts/build_llama_server.py --quiet)"
export CACTUS_LLAMA_SERVER
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache  # the wings' contract (pyproject.toml [tool.importlinter])
.venv/bin/python -m pytest -n 2 -q
.venv/bin/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
