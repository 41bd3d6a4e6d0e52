"""``check_study``: a study written outside the package (``coin_study.py``) passes it, resume, a cluster of two
worker processes and all; each planted broken study, broken as a contributor breaks one, fails it on the check its
defect breaks; a check that cannot run says so and is not reported passed."""

import sys

import pytest
from coin_study import (
    AllWhenHeld,
    CoinStudy,
    DefaultsSaidWrong,
    FirstRecordSummary,
    FixedSetting,
    FlipsSaidOutside,
    MutatingSummary,
    NothingWhenHeld,
    OwnSetting,
    PrivateFlips,
    ProcessCoins,
    RepeatedKey,
    StatefulCoins,
)

from cactus_theory import run_study
from cactus_theory.testing import STUDY_CHECKS, check_study


@pytest.mark.distributed
def test_a_users_study_keeps_the_contract():
    report = check_study(CoinStudy)
    assert list(report) == list(STUDY_CHECKS)
    assert all(outcome == "passed" for outcome in report.values()), report


def test_a_study_run_gives_its_records_in_the_order_of_its_units(tmp_path):
    records = run_study(CoinStudy(n=3), out=tmp_path / "coins.jsonl")
    assert [(r["unit"], r["side"]) for r in records] == [(u, s) for u in range(3) for s in ("heads", "tails")]
    assert all(r["record"] == "coins" and r["setting"] == {"flips": 20, "seed": 0} for r in records)
    heads = int(CoinStudy().flips_of(0).sum())
    assert [r["count"] for r in records[:2]] == [heads, 20 - heads]
    with pytest.raises(ValueError, match="holds records of another setting"):
        run_study(CoinStudy(n=3, seed=1), out=tmp_path / "coins.jsonl")


def test_a_field_that_decides_records_cannot_be_forgotten(tmp_path):
    """The setting is derived: a run with 50 flips is never resumed from a file of 20 flips."""
    run_study(CoinStudy(n=2, flips=20), out=tmp_path / "coins.jsonl")
    with pytest.raises(ValueError, match=r"another setting \(line 1: flips: 20 -> 50\)"):
        run_study(CoinStudy(n=2, flips=50), out=tmp_path / "coins.jsonl")


def test_each_record_carries_its_share_of_the_units_time():
    from cactus_theory._util._study import RUN_SECONDS, run_seconds

    records = run_study(CoinStudy(n=3))
    assert all(r[RUN_SECONDS] >= 0 for r in records)
    assert run_seconds(records) == pytest.approx(sum(r[RUN_SECONDS] for r in records))
    assert run_seconds([{"id": 1}, {RUN_SECONDS: float("nan")}, {RUN_SECONDS: 2.5}]) == 2.5


#: Each planted broken study and the check it breaks.
PLANTED = [
    (RepeatedKey, "study_units"),
    (OwnSetting, "study_setting"),
    (FlipsSaidOutside, "study_setting"),
    (PrivateFlips, "study_setting"),
    (NothingWhenHeld, "study_partly_held"),
    (AllWhenHeld, "study_partly_held"),
    (StatefulCoins, "study_resume"),
    (FixedSetting, "study_other_setting"),
    (FirstRecordSummary, "study_summary"),
    (MutatingSummary, "study_summary"),
    (DefaultsSaidWrong, "study_summary"),
    (ProcessCoins, "study_cluster"),
]


@pytest.mark.parametrize(
    ("broken", "check"),
    [pytest.param(*p, marks=[pytest.mark.distributed] if p[1] == "study_cluster" else []) for p in PLANTED],
)
def test_each_planted_broken_study_fails_the_check_it_breaks(broken, check):
    with pytest.raises(AssertionError, match=f"^{check}: "):
        check_study(broken, checks=[check])


def test_every_check_has_a_planted_broken_study():
    assert {check for _, check in PLANTED} == set(STUDY_CHECKS)


def test_each_planted_study_passes_every_other_check_it_can_fail_only_by_its_defect():
    """The plants are broken in one way each: the checks before theirs pass them (the defect is what fails)."""
    order = list(STUDY_CHECKS)
    for broken, check in PLANTED:
        before = [c for c in order[: order.index(check)] if c not in ("study_cluster",)]
        if broken in (FixedSetting, OwnSetting):  # a written setting fails study_setting as well
            before = [c for c in before if c != "study_setting"]
        if before:
            report = check_study(broken, checks=before)
            assert all(v.startswith(("passed", "skipped")) for v in report.values()), (broken, report)


def test_the_flips_said_outside_are_named_in_the_failure():
    with pytest.raises(AssertionError, match=r"flips is said to decide no record .* flips=21 .* flips=20"):
        check_study(FlipsSaidOutside, checks=["study_setting"])


def test_a_check_that_cannot_run_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as where the distributed extra is missing
    report = check_study(CoinStudy, checks=["study_setting", "study_cluster"])
    assert report["study_cluster"] == "skipped: distributed is not installed (the distributed extra)"
    assert report["study_setting"] == "passed"


def test_a_study_whose_units_give_one_record_each_is_not_checked_partly_held():
    class OneSide(CoinStudy):
        def unit_keys(self, unit):
            return [(unit, "heads")]

        def run_unit(self, unit, held):
            return super().run_unit(unit, held)[:1]

    assert check_study(OneSide, checks=["study_partly_held"]) == {
        "study_partly_held": "skipped: every unit gives one record: none can be partly held"
    }


def test_check_study_takes_studies_and_known_checks_only():
    with pytest.raises(TypeError, match="must build a Study"):
        check_study(lambda: object())
    with pytest.raises(ValueError, match="unknown"):
        check_study(CoinStudy, checks=["study_speed"])
