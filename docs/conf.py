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
# docs/results/ holds the experiments' generated pages (snake_case names: included by the results pages,
# never pages of their own) beside the results pages (hyphenated names, and the index)
_RESULTS = os.path.join(HERE, "results")
exclude_patterns = ["_build", "_generated", "results/**/*.md", "Thumbs.db", ".DS_Store"] + [
    f"results/{name}"
    for name in sorted(os.listdir(_RESULTS))
    if name.endswith(".md") and "-" not in name and name != "index.md"
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# The kernels that execute the pages warn, one line per page, that they talk to the build over
# local TCP without encryption (ipykernel >= 7). That is how nbclient runs every kernel; the
# line is dropped (only that one: every other kernel message still prints) by a kernel config
# file in an IPython directory of the build's own, never the user's.
_IPYTHON_DIR = os.path.join(HERE, "_build", "ipython")
os.makedirs(os.path.join(_IPYTHON_DIR, "profile_default"), exist_ok=True)
_KERNEL_CONFIG = os.path.join(_IPYTHON_DIR, "profile_default", "ipython_kernel_config.py")
_QUIET = """import logging


class _NoTransportNote(logging.Filter):
    def filter(self, record):
        return "running over TCP without encryption" not in record.getMessage()


logging.getLogger("IPKernelApp").addFilter(_NoTransportNote())
"""
if not os.path.exists(_KERNEL_CONFIG) or open(_KERNEL_CONFIG).read() != _QUIET:
    with open(_KERNEL_CONFIG + ".tmp", "w") as fh:
        fh.write(_QUIET)
    os.replace(_KERNEL_CONFIG + ".tmp", _KERNEL_CONFIG)
os.environ["IPYTHONDIR"] = _IPYTHON_DIR

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

# One page per registered rule, generated from the registry (so a new rule gets its page for
# free): the spec signature, a one-step figure drawn at build time, and the class docstring.
_RULES_DST = os.path.join(HERE, "rules")
_RULE_PAGE = """---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---

# {name}

`{signature}`: {summary}

Build it with `make_rule("{name}")` (or `cactus-theory analyze --rules '{name}'`); class
`{cls}`{fixed}.{logits}

Source: {reference}

```{{code-cell}} python
:tags: [hide-input]
import matplotlib.pyplot as plt
import numpy as np
import cactus_theory as ct

rng = np.random.default_rng(0)
settings = ct.SamplingSettings(temperature=1.0, top_k=10, top_p=0.95)
target_logits = rng.normal(size=12) * 2
draft_logits = 0.3 * target_logits + 1.5 * rng.normal(size=12)
draft_probs = ct.processed_probs(draft_logits, settings)
target_probs = ct.processed_probs(target_logits, settings)
logits = ct.rules.RuleLogits(target=target_logits, draft=draft_logits, temperature=settings.temperature)
rule = ct.make_rule("{name}")
fig, ax = plt.subplots(figsize=(7, 3))
ct.compare.plot_step(rule, draft_probs, target_probs, ax=ax, logits=logits)
fig.tight_layout()
m = ct.step_metrics(rule, draft_probs, target_probs, logits=logits)
sps = ct.step_metrics(ct.SpS(), draft_probs, target_probs)
print(f"acceptance {{float(m.acceptance):.3f}} (SpS {{float(sps.acceptance):.3f}}), "
      f"of which outside the verifier's support {{float(m.acceptance_outside_support):.3f}}; "
      f"KL(pi || q) = {{float(m.kl_emitted_target):.4f}}, TV = {{float(m.tv):.4f}}")
```

One step at the defaults on 12 tokens (Gaussian raw logits, seed 0, temperature 1, top-k 10,
top-p 0.95 for both models): the draft $p$, the verifier $q$ and what the rule emits, $\\pi$
(exact, `emitted_distribution`).

```{{eval-rst}}
.. autoclass:: cactus_theory.rules.{cls}
   :members: acceptance, correction, emitted
   :no-index:
```
"""


def _write_rule_pages():
    from cactus_theory import available_rules

    wanted = set()
    for name, info in available_rules().items():
        rule = cactus_theory.make_rule(name)
        fixed = ", ".join(f"{k}={v!r}" for k, v in info.fixed.items())
        roles = " and ".join(rule.needs_logits)
        page = _RULE_PAGE.format(
            name=name,
            signature=info.signature(),
            summary=" ".join((info.rule_class.__doc__ or "").strip().split("\n\n")[0].split()),
            cls=info.rule_class.__name__,
            fixed=f" with {fixed}" if fixed else "",
            logits=f" It needs the {roles} logits from before the sampling processing (`RuleLogits`)." if roles else "",
            reference=info.reference or "this package",
        )
        path = os.path.join(_RULES_DST, f"{name}.md")
        wanted.add(path)
        if not os.path.exists(path) or open(path).read() != page:
            with open(path, "w") as fh:
                fh.write(page)
    for name in os.listdir(_RULES_DST):  # pages of rules no longer registered
        path = os.path.join(_RULES_DST, name)
        if name != "index.md" and name.endswith(".md") and path not in wanted:
            os.remove(path)


_write_rule_pages()

# The rules table (docs/explanation/rules.md) and the rule classes of the API page (docs/api.md), from
# the registry: a rule module adds its row and its entry without a line written here.
_GENERATED = os.path.join(HERE, "_generated")


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as fh:
            fh.write(text)


def _write_rule_lists():
    from cactus_theory import available_rules

    rows = [
        "| spec name | acceptance | correction | emitted law | lossless | source |",
        "|---|---|---|---|---|---|",
    ]
    classes = {}
    for name, info in available_rules().items():
        if not info.builtin:
            continue
        cells = info.table
        params = ", ".join(info.parameters)
        label = f"{name}({params})" if params else name
        spec = f"{{doc}}`{label} </rules/{name}>`"
        keys = ("acceptance", "correction", "emitted", "lossless")
        row = [spec] + [cells.get(k, "").replace("|", "\\|") for k in keys]
        rows.append("| " + " | ".join(row) + f" | {info.reference.split(';')[0]} |")
        classes.setdefault(info.rule_class.__name__, info.rule_class)
    _write(os.path.join(_GENERATED, "rules_table.md"), "\n".join(rows) + "\n")
    api = ["```{eval-rst}"]
    for cls_name in sorted(classes, key=str.lower):
        api.append(f".. autoclass:: cactus_theory.rules.{cls_name}")
    for name in sorted(n for n in cactus_theory._rules.rule_exports() if n not in classes):
        api.append(f".. autofunction:: cactus_theory.rules.{name}")
    api.append("```")
    _write(os.path.join(_GENERATED, "api_rules.md"), "\n".join(api) + "\n")


_write_rule_lists()


def _write_benchmark_table():
    """The benchmarks' table (the quality referee's results page), from their registry: a benchmark module
    adds its row."""
    from cactus_theory.benchmarks import benchmark_names, get_benchmark

    rows = [
        "| benchmark | graded | answers are programs | file in the data directory | where to get it |",
        "|---|---|---|---|---|",
    ]
    for name in benchmark_names(plugins=False):
        bench = get_benchmark(name)
        cells = [
            f"`{name}`",
            "yes" if bench.graded else "prompts only",
            "yes: run only when asked" if bench.runs_code else "no",
            f"`{bench.file}`" if bench.file else "the file you give (`--file`)",
            bench.source.replace("|", "\\|") or "-",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    _write(os.path.join(_GENERATED, "benchmarks_table.md"), "\n".join(rows) + "\n")


_write_benchmark_table()

# Dataclass fields named like common words (delta, gamma) exist on several classes; an
# ambiguous cross-reference from a type annotation is not an error in the text.
suppress_warnings = ["ref.python"]
