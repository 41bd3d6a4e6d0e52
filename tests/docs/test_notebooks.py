"""The notebooks are stored without outputs (the docs build executes them; see docs/conf.py)."""

import json

import pytest
from locations import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_at_least_three_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_stale_outputs(path):
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{path.name}: clear the outputs before committing"
            assert cell["execution_count"] is None, f"{path.name}: clear the execution counts"
