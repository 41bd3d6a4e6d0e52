"""A study written outside the package, as a user writes one: coins flipped by seed, one unit per seed, and
planted broken variants of it, each broken the way a contributor breaks a study (``check_study`` must fail each on
the check its defect breaks)."""

import itertools
import os
from typing import ClassVar

import numpy as np

from cactus_theory import Study
from cactus_theory.studies import RowsResult


class CoinResult(RowsResult):
    """The share of heads over every flip."""

    name = "coins"

    def __init__(self, rows):
        self.rows = rows

    def render(self):
        return "\n".join(f"{r['what']}: {r['value']:.4f}" for r in self.rows)


class CoinStudy(Study):
    kind: ClassVar[str] = "coins"
    unit_name: ClassVar[str] = "seed"
    outside_setting: ClassVar[dict] = {"n": "how many units: each record names its unit"}
    summary_options: ClassVar[dict] = {"side": "heads"}

    def __init__(self, n=6, flips=20, seed=0):
        self.n, self.flips, self.seed = n, flips, seed

    def units(self):
        return list(range(self.n))

    def unit_keys(self, unit):
        return [(unit, "heads"), (unit, "tails")]

    def key(self, record):
        return (record["unit"], record["side"])

    def flips_of(self, unit):
        return np.random.default_rng([self.seed, unit]).integers(0, 2, self.flips)

    def run_unit(self, unit, held):
        flips = self.flips_of(unit)
        records = [
            {"unit": unit, "side": "heads", "count": int(flips.sum())},
            {"unit": unit, "side": "tails", "count": int(self.flips - flips.sum())},
        ]
        return [r for r in records if (r["unit"], r["side"]) not in held]

    def summarize(self, records, *, side="heads"):
        chosen = sum(r["count"] for r in records if r["side"] == side)
        total = sum(r["count"] for r in records)
        return CoinResult([{"what": side, "value": chosen / total}])


_COUNTER = itertools.count()


class RepeatedKey(CoinStudy):
    """Broken: two units list the same key."""

    def unit_keys(self, unit):
        return [(unit // 2, "heads"), (unit // 2, "tails")]


class OwnSetting(CoinStudy):
    """Broken: it writes its own setting, which leaves out the flips that decide its records (a run with 50 flips
    resumed from a file of 20 would return the 20-flip counts)."""

    def setting(self):
        return {"seed": self.seed}


class FlipsSaidOutside(CoinStudy):
    """Broken: it says the flips decide no record."""

    outside_setting: ClassVar[dict] = {**CoinStudy.outside_setting, "flips": "the flips a unit makes"}


class PrivateFlips(CoinStudy):
    """Broken: it keeps the flips under a leading underscore, out of the setting."""

    def __init__(self, n=6, flips=20, seed=0):
        self.n, self._flips, self.seed = n, flips, seed

    @property
    def flips(self):
        return self._flips


class NothingWhenHeld(CoinStudy):
    """Broken: a unit with any record held gives none (it takes a held unit for a done one)."""

    def run_unit(self, unit, held):
        return [] if held else super().run_unit(unit, held)


class AllWhenHeld(CoinStudy):
    """Broken: a unit gives every record, held or not (the held one again, made anew)."""

    def run_unit(self, unit, held):
        return super().run_unit(unit, {})


class StatefulCoins(CoinStudy):
    """Broken: a unit's records depend on how many units this process ran before it."""

    def flips_of(self, unit):
        return np.random.default_rng([self.seed, unit, next(_COUNTER)]).integers(0, 2, self.flips)


class FixedSetting(CoinStudy):
    """Broken: its setting is one fixed value, whatever its fields (a file of other flips is resumed)."""

    def setting(self):
        return {"coins": 1}


class FirstRecordSummary(CoinStudy):
    """Broken: the summary reads the first record it is given."""

    def summarize(self, records, *, side="heads"):
        return CoinResult([{"what": "first", "value": float(records[0]["count"])}])


class MutatingSummary(CoinStudy):
    """Broken: the summary changes the records it is given."""

    def summarize(self, records, *, side="heads"):
        for r in records:
            r["count"] = int(r["count"])
            r["seen"] = True
        return super().summarize(records)


class DefaultsSaidWrong(CoinStudy):
    """Broken: its declared summary default is not the one summarize uses."""

    summary_options: ClassVar[dict] = {"side": "tails"}


class ProcessCoins(CoinStudy):
    """Broken: a record names the process that made it."""

    def run_unit(self, unit, held):
        return [{**r, "process": os.getpid()} for r in super().run_unit(unit, held)]
