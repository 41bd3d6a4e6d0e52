"""Adding a block-judging rule is one file (``block_sps_plugin.py``, the worked example of the house page):
from that file alone, in a fresh interpreter (so no other test sees it registered), the conformance checks
pass, the analysis and the planner's laws give token-wise SpS's accepted length (the same law, an
independent computation: SpS's prefix product), the simulator samples it, real decoding runs it through
the block step, and the command line takes it with --plugin."""

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from locations import HANG_GUARD, TESTS

PLUGIN = pathlib.Path(__file__).with_name("block_sps_plugin.py")

CHILD = """
import json, sys
import numpy as np
sys.path[:0] = [{tests!r}]
import block_sps_plugin  # registers "block-sps"
from trace_builders import random_trace
from cactus_theory import analyze_trace, simulate
from cactus_theory.laws import block_accepted_length
from cactus_theory.rules import judgement_of, BlockSpS
from cactus_theory.testing import check_rule

out = {{}}
report = check_rule("block-sps", cases=4)
out["failed"] = [k for k, v in report.items() if v not in ("passed",) and not v.startswith(("skipped", "not "))]
out["ran"] = sorted(k for k, v in report.items() if v == "passed")
out["judgement"] = [judgement_of(BlockSpS()).block, judgement_of(BlockSpS()).token_drift]
trace = random_trace({trace!r}, 3, [f"s{{i}}" for i in range(5)])
result = analyze_trace(trace, ["block-sps", "sps"], ms=(1, 3, 6), n_boot=0, progress=False)
out["al"] = {{m: [result.accepted_length(r, m, n_boot=0)[0] for r in ("block-sps", "sps")] for m in (1, 3, 6)}}
rng = np.random.default_rng(0)
p, q = rng.dirichlet(np.ones(5), size=9), rng.dirichlet(np.ones(5), size=9)
sim = simulate("block-sps", p, q, m=3, n_runs=20000, seed=1)
exact = np.concatenate([block_accepted_length("block-sps", p, q, 3, method="exact"), np.zeros(3)])
out["sim_gap"] = float(abs(np.mean(sim.accepted - exact[sim.block_start])))
out["sim_se"] = float(np.std(sim.accepted - exact[sim.block_start]) / np.sqrt(sim.accepted.size))
out["sps_al"] = float(np.mean(block_accepted_length("sps", p, q, 3)))
out["block_al"] = float(np.mean(exact[: p.shape[0] - 2]))
print(json.dumps(out))
"""

DECODE = """
import sys
sys.path[:0] = [{tests!r}]
import block_sps_plugin
from tiny_models import tiny_model
from cactus_theory import SamplingSettings, speculative_generate
result = speculative_generate(tiny_model(2), tiny_model(3, layers=1), "block-sps", 3,
                              SamplingSettings(temperature=1.0, top_k=8, top_p=1.0), 12, 5, [3, 5, 7])
assert len(result.tokens) == 12 and all(0 <= a <= 3 for a in result.accepted), result
print("decoded", len(result.tokens), sum(result.accepted))
"""


def _run(tmp_path, code):
    shutil.copy(PLUGIN, tmp_path / PLUGIN.name)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_block_rule_in_one_file_is_checked_analysed_and_simulated(tmp_path):
    out = json.loads(_run(tmp_path, CHILD.format(tests=str(TESTS), trace=str(tmp_path / "trace"))).splitlines()[-1])
    assert out["failed"] == []
    for check in ("block_lossless", "block_at_least_token", "block_survival", "block_monte_carlo"):
        assert check in out["ran"], out["ran"]
    assert out["judgement"] == [True, False]
    for m, (block, sps) in out["al"].items():
        assert block == pytest.approx(sps, rel=1e-12, abs=1e-12), m
    assert out["block_al"] == pytest.approx(out["sps_al"], rel=1e-12)
    assert out["sim_gap"] < 5 * out["sim_se"] + 1e-12


@pytest.mark.models
def test_a_block_rule_in_one_file_decodes_through_the_block_step(tmp_path):
    assert _run(tmp_path, DECODE.format(tests=str(TESTS))).startswith("decoded 12")


def test_the_command_line_takes_it_with_plugin(tmp_path):
    shutil.copy(PLUGIN, tmp_path / PLUGIN.name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cactus_theory",
            "--plugin",
            PLUGIN.name,
            "analyze",
            "--rules",
            "block-sps,sps",
            "--m",
            "3",
            "--delta",
            "1",
            "--bootstrap",
            "0",
            "--quiet",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    block = [line.split()[1:] for line in lines if line.startswith("block-sps ")]
    sps = [line.split()[1:] for line in lines if line.startswith("sps ")]
    assert block and block == sps, done.stdout[-2000:]  # the same law: every column equal, task by task
