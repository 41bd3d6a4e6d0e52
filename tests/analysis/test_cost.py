"""Cost models: a predicted speedup is finite, positive and at most AL + 1, falling verifier times are
fitted, bad, huge or zero cost files and an empty profile name are refused naming the file."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory import CostModel
from cactus_theory._cli import main
from cactus_theory.plan import load_cost

_times = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    first=st.floats(min_value=1e-6, max_value=1e3),
    others=st.dictionaries(st.integers(2, 64), _times, max_size=8),
    draft=_times,
    overhead=_times,
    judge=_times,
    m=st.integers(1, 100),
    share=st.floats(0.0, 1.0),
)
def test_a_predicted_speedup_is_finite_positive_and_at_most_al_plus_one(
    first, others, draft, overhead, judge, m, share
):
    # any valid cost file: verify times may fall with the block size (noisy or flat GPU profiles)
    cost = CostModel(draft_token=draft, verify_block={1: first, **others}, step_overhead=overhead, judge_token=judge)
    al = share * m
    speedup = float(cost.speedup(m, al))
    assert np.isfinite(speedup) and speedup > 0
    assert speedup <= (al + 1) * (1 + 1e-12)
    fit = list(cost.verify_fit.values())
    assert all(a <= b for a, b in itertools.pairwise(fit))  # the fit never falls


def test_falling_verify_times_no_longer_give_infinite_or_negative_speedups():
    # the case: 2.06, inf, -2.06, -1.03 from an extrapolation with a negative slope
    cost = CostModel(draft_token=0.01, verify_block={1: 1.0, 9: 0.5})
    assert cost.non_monotone == [9]
    assert cost.verify_fit == {1: 0.75, 9: 0.75}  # the isotonic fit pools the two
    speedups = [float(cost.speedup(m, m * 0.8)) for m in (2, 9, 20, 40)]
    assert all(np.isfinite(s) and 0 < s for s in speedups)


def _cost_file(tmp_path, text):
    path = tmp_path / "cost.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"draft_token": 0.1, "verify_block": {"1": 1}, "source": "x"}', "source must be an object"),
        ('{"draft_token": ' + "9" * 400 + ', "verify_block": {"1": 1}}', "draft_token must be finite.*400 digits"),
        ('{"draft_token": 0.1, "verify_block": {"1": 1, " 1": 2}}', r"block sizes .*got ' 1'"),
        ('{"draft_token": 0.1, "verify_block": {"1": 1, "1": 2}}', "the key '1' appears twice"),
        ('{"draft_token": 1e999, "verify_block": {"1": 1}}', "draft_token must be finite"),
    ],
)
def test_bad_cost_files_are_refused_naming_the_file(tmp_path, text, match):
    path = _cost_file(tmp_path, text)
    with pytest.raises(ValueError, match=match) as exc:
        load_cost(path)
    assert path in str(exc.value)


def test_a_huge_cost_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "cost.json"
    with open(path, "wb") as fh:
        fh.truncate(100 << 20)  # sparse: 100 MB that take no disk
    with pytest.raises(ValueError, match="a cost file is a few kB") as exc:
        load_cost(str(path))
    assert len(str(exc.value)) < 300


def test_a_cost_file_with_zero_timings_is_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps({"draft_token": 0.01, "verify_block": {"1": 0.03}, "samples": {"verify_block": {"1": [0, 0, 1]}}})
    )
    with pytest.raises(ValueError, match=r"samples\['verify_block'\]\[1\] holds a timing of 0 seconds"):
        load_cost(path)


def test_cli_refuses_an_empty_cost_profile_name(capsys):
    assert main(["plan", "--cost-profile", "", "--m", "2", "--bootstrap", "0", "--quiet"]) == 2
    assert "unknown cost profile ''" in capsys.readouterr().err


def test_a_cost_file_with_timings_no_machine_measures_is_refused(tmp_path):
    from cactus_theory.plan import load_cost

    for field, value in (("draft_token", 1e-303), ("verify_block", {"1": 0.03, "2": 7200.0})):
        path = tmp_path / f"{field}.json"
        data = {"draft_token": 0.01, "verify_block": {"1": 0.03, "2": 0.04}}
        data[field] = value
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=r"lies outside what a machine measures for a forward pass"):
            load_cost(path)
