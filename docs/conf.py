"""Sphinx configuration: MyST Markdown pages and notebooks executed at build time (myst-nb).

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (scripts/check.sh does it in CI).
The notebooks live in ../notebooks; they are copied next to the pages at build time and
executed there, so every figure in the site is drawn by the package during the build.
"""

from __future__ import annotations

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))

import cactus_theory  # noqa: E402

project = "cactus_theory"
author = "cactus_theory developers"
copyright = "2026, cactus_theory developers"
release = version = cactus_theory.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
exclude_patterns = ["_build", "results/*.md", "results/**/*.md", "Thumbs.db", ".DS_Store"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autosummary_generate = False
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_ivar = True

html_theme = "pydata_sphinx_theme"
html_title = "cactus_theory"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
html_static_path: list[str] = []

# The notebooks are stored in ../notebooks (without outputs); build a copy here.
_NB_SRC = os.path.join(HERE, "..", "notebooks")
_NB_DST = os.path.join(HERE, "notebooks")
if os.path.isdir(_NB_SRC):
    shutil.rmtree(_NB_DST, ignore_errors=True)
    os.makedirs(_NB_DST)
    for name in sorted(os.listdir(_NB_SRC)):
        if name.endswith(".ipynb"):
            shutil.copy2(os.path.join(_NB_SRC, name), os.path.join(_NB_DST, name))

# Dataclass fields named like common words (delta, gamma) exist on several classes; an
# ambiguous cross-reference from a type annotation is not an error in the text.
suppress_warnings = ["ref.python"]
