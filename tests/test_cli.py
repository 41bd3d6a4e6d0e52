"""The command line: `cactus-theory gamma` and `python -m cactus_theory`."""

import json
import subprocess
import sys

import mpmath as mp
import mpref

from cactus_theory._cli import main


def test_gamma_table(capsys):
    assert main(["gamma", "--target-prob", "0.3", "--delta", "1.0", "--draft-prob", "0.8"]) == 0
    out = capsys.readouterr().out
    exact = mpref.gamma_star("kl", 0.3, 1.0)
    assert f"{float(exact):.12f}" in out
    assert "taylor" in out and "safe" in out and "P(accept)" in out


def test_gamma_json_reports_achieved_divergence(capsys):
    assert main(["gamma", "--target-prob", "0.9", "--delta", "0.01", "--json", "--draft-prob", "0.99"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert abs(rows["taylor"]["divergence"] - 0.0116) < 5e-5 and not rows["taylor"]["within_delta"]
    assert rows["safe"]["within_delta"] and rows["exact"]["within_delta"]
    assert abs(mp.mpf(rows["exact"]["acceptance"]) - mpref.gamma_star("kl", 0.9, 0.01) / mp.mpf(0.99)) < 1e-14


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cactus_theory", *args], capture_output=True, text=True, check=False)


def test_module_entry_point_and_bad_input():
    ok = _run("gamma", "--target-prob", "0.3", "--delta", "1", "--divergence", "chi2")
    assert ok.returncode == 0 and "chi2" in ok.stdout
    bad = _run("gamma", "--target-prob", "1.3", "--delta", "1")
    assert bad.returncode == 2 and "must be a probability in [0, 1]" in bad.stderr
    bad = _run("gamma", "--target-prob", "0.3", "--delta", "-1")
    assert bad.returncode == 2 and "budget >= 0" in bad.stderr
