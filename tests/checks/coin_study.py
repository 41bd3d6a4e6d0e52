"""A study written outside the package, as a user writes one: coins flipped by seed, one unit per seed, and
planted broken variants of it (``check_study`` must fail each on the check its defect breaks)."""

import itertools
import os
from typing import ClassVar

import numpy as np

from cactus_theory import RowsResult, Study


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

    def __init__(self, n=6, flips=20, seed=0):
        self.n, self.flips, self.seed = n, flips, seed

    def setting(self):
        return {"flips": self.flips, "seed": self.seed}

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

    def summarize(self, records):
        heads = sum(r["count"] for r in records if r["side"] == "heads")
        total = sum(r["count"] for r in records)
        return CoinResult([{"what": "heads", "value": heads / total}])


_COUNTER = itertools.count()


class StatefulCoins(CoinStudy):
    """Broken: a unit's records depend on how many units this process ran before it."""

    def flips_of(self, unit):
        return np.random.default_rng([self.seed, unit, next(_COUNTER)]).integers(0, 2, self.flips)


class FirstRecordSummary(CoinStudy):
    """Broken: the summary reads the first record it is given."""

    def summarize(self, records):
        return CoinResult([{"what": "first", "value": float(records[0]["count"])}])


class ProcessCoins(CoinStudy):
    """Broken: a record names the process that made it."""

    def run_unit(self, unit, held):
        return [{**r, "process": os.getpid()} for r in super().run_unit(unit, held)]


class MutatingSummary(CoinStudy):
    """Broken: the summary changes the records it is given."""

    def summarize(self, records):
        for r in records:
            r["count"] = int(r["count"])
            r["seen"] = True
        return super().summarize(records)
