"""``check_study``: a study written outside the package (``coin_study.py``) passes it, resume, a cluster of two
worker processes and all; each planted broken study fails it on the check its defect breaks; the package's own
studies (the exact referee, the sampled referee, decoding) pass it on a tiny model pair."""

import pytest
from coin_study import CoinStudy, FirstRecordSummary, MutatingSummary, ProcessCoins, StatefulCoins

from cactus_theory import run_study
from cactus_theory.testing import STUDY_CHECKS, check_study


@pytest.mark.distributed
def test_a_users_study_keeps_the_contract():
    assert check_study(CoinStudy) == list(STUDY_CHECKS)


def test_a_study_run_gives_its_records_in_the_order_of_its_units(tmp_path):
    records = run_study(CoinStudy(n=3), out=tmp_path / "coins.jsonl")
    assert [(r["unit"], r["side"]) for r in records] == [(u, s) for u in range(3) for s in ("heads", "tails")]
    assert all(r["record"] == "coins" and r["setting"] == {"flips": 20, "seed": 0} for r in records)
    assert [r["count"] for r in records[:2]] == [
        int(CoinStudy().flips_of(0).sum()),
        20 - int(CoinStudy().flips_of(0).sum()),
    ]
    with pytest.raises(ValueError, match="holds records of another setting"):
        run_study(CoinStudy(n=3, seed=1), out=tmp_path / "coins.jsonl")


@pytest.mark.parametrize(
    ("broken", "check"),
    [
        (StatefulCoins, "study_resume"),
        (FirstRecordSummary, "study_summary"),
        (MutatingSummary, "study_summary"),
        pytest.param(ProcessCoins, "study_cluster", marks=pytest.mark.distributed),
    ],
)
def test_each_planted_broken_study_fails_the_check_it_breaks(broken, check):
    with pytest.raises(AssertionError, match=f"^{check}: "):
        check_study(broken, checks=["study_units", "study_resume", "study_other_setting", "study_summary", check])


def test_check_study_takes_studies_and_known_checks_only():
    with pytest.raises(TypeError, match="must build a Study"):
        check_study(lambda: object())
    with pytest.raises(ValueError, match="unknown"):
        check_study(CoinStudy, checks=["study_speed"])
