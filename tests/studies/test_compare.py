"""The every-rule comparison (``compare``): it reproduces its committed page and runs on any trace."""

import numpy as np
from locations import ROOT

from cactus_theory._cli import main
from cactus_theory.traces import trace_from_arrays


def test_compare_reproduces_the_committed_page_and_runs_on_any_trace(tmp_path, capsys):
    assert main(["compare", "--out", str(tmp_path / "c"), "--bootstrap", "1000", "--processes", "2", "--quiet"]) == 0
    ours = (tmp_path / "c" / "rules_comparison.md").read_text().splitlines()
    committed = (ROOT / "docs" / "results" / "rules_comparison.md").read_text().splitlines()
    # the same page but for the line naming the command that made it
    assert [x for x in ours if not x.startswith("Command:")] == [x for x in committed if not x.startswith("Command:")]
    rng = np.random.default_rng(0)
    target = rng.normal(size=(60, 40)) * 2
    trace_from_arrays(
        tmp_path / "t",
        target + rng.normal(size=target.shape),
        target,
        rng.integers(40, size=60),
        sequence_lengths=[30, 30],
        top_k=40,
        metadata={"sampling": {"temperature": 1.0, "top_k": 40, "top_p": 1.0}},
    )
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "t"), "--out", str(tmp_path / "d"), "--bootstrap", "0", "--quiet"]) == 0
    page = (tmp_path / "d" / "rules_comparison.md").read_text()
    assert "# Every rule on a trace" in page and "60 positions" in page
    assert (tmp_path / "d" / "rules_comparison.png").stat().st_size > 1000
