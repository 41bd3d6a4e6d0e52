"""``check_study``: the contract every long run keeps, checked on any study (scikit-learn's ``check_estimator`` for
studies): a study of the package's and a user's alike. Each check is a named function; a failure is an
AssertionError that names it.

- ``study_units``: units and keys are well formed: at least one unit, no key in two units, every record the
  run returns under a key of its unit;
- ``study_resume``: a run stopped after its first unit (Ctrl-C) and run again gives the records an
  uninterrupted run gives (fields the study declares ``volatile``, timings, apart);
- ``study_other_setting``: a records file of another setting is refused, and left as it was;
- ``study_summary``: the summary is a function of the records alone: the same from the records returned,
  read back from the file, or in another order, and it changes none of them;
- ``study_cluster``: a Dask cluster of two worker processes gives the records one process gives (where
  ``distributed`` is installed; the study must then be one a worker can load: models given by path).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import tempfile

from .._util._study import Study, run_study

__all__ = ["STUDY_CHECKS", "check_study"]


def _stable(value, volatile):
    """``value`` without the ``volatile`` fields, at any depth."""
    if isinstance(value, dict):
        return {k: _stable(v, volatile) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [_stable(v, volatile) for v in value]
    return value


def _same(a, b) -> bool:
    """Equal as JSON reads them, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _rows(result):
    """A summary as comparable data: a result's records (and its table), or the value itself."""
    if hasattr(result, "records") and callable(result.records):
        return {"records": json.loads(json.dumps(result.records(), default=str)), "table": result.table()}
    return json.loads(json.dumps(result, default=str))


def _read(path) -> list:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _check(name, condition, why):
    if not condition:
        raise AssertionError(f"{name}: {why}")


def study_units(make_study, work, records) -> None:
    study = make_study()
    units = study.units()
    _check("study_units", len(units) > 0, "the study has no unit")
    keys = [k for u in units for k in study.unit_keys(u)]
    _check("study_units", len(set(keys)) == len(keys), "a key is listed by two units (or twice by one)")
    got = [study.key(r) for r in records]
    _check("study_units", got == keys, "the run's records are not one per key, in the units' order")


def study_resume(make_study, work, records) -> None:
    study = make_study()
    volatile = set(study.volatile)
    out = os.path.join(work, "resumed.jsonl")
    calls = [0]
    run_unit = study.run_unit

    def stop_after_first(unit, held):
        calls[0] += 1
        if calls[0] > 1:
            raise KeyboardInterrupt  # as Ctrl-C would, between two units
        return run_unit(unit, held)

    study.run_unit = stop_after_first
    interrupted = False
    try:
        run_study(study, out=out, progress=False)
    except KeyboardInterrupt:
        interrupted = True
    kept = _read(out)
    if interrupted:
        _check("study_resume", 0 < len(kept) < len(records), "a run stopped after one unit kept no record, or all")
    resumed = run_study(make_study(), out=out, progress=False)
    _check(
        "study_resume",
        _same(_stable(resumed, volatile), _stable(records, volatile)),
        "a resumed run gives other records than an uninterrupted one",
    )
    _check("study_resume", _same(_stable(_read(out), volatile), _stable(records, volatile)), "the file differs")


def study_other_setting(make_study, work, records) -> None:
    study = make_study()
    path = os.path.join(work, "other.jsonl")
    with open(path, "w") as fh:
        for rec in records[:1]:
            fh.write(json.dumps({**rec, "setting": {"another": "setting"}}) + "\n")
    before = open(path, "rb").read()
    try:
        run_study(study, out=path, progress=False)
    except ValueError as exc:
        _check("study_other_setting", "another setting" in str(exc), f"refused with another message: {exc}")
    else:
        raise AssertionError("study_other_setting: a records file of another setting was resumed")
    _check("study_other_setting", open(path, "rb").read() == before, "the refused file was changed")


def study_summary(make_study, work, records) -> None:
    study = make_study()
    kept = copy.deepcopy(records)
    first = _rows(study.summarize(records))
    _check("study_summary", _same(records, kept), "summarize changed the records it was given")
    shuffled = list(records)
    random.Random(0).shuffle(shuffled)
    _check("study_summary", _same(_rows(study.summarize(shuffled)), first), "the summary depends on the order")
    path = os.path.join(work, "summary.jsonl")
    run_study(make_study(), out=path, progress=False)
    from_file = _read(path)
    if not study.volatile:
        _check("study_summary", _same(_rows(study.summarize(from_file)), first), "the file's records summarise apart")
    _check("study_summary", _same(_rows(make_study().summarize(records)), first), "a second study summarises apart")


def study_cluster(make_study, work, records) -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return
    from .._util._cluster import close_quietly, local_dask_cluster

    study = make_study()
    client, cluster = local_dask_cluster(2)
    try:
        spread = run_study(study, out=os.path.join(work, "cluster.jsonl"), progress=False, client=client)
    finally:
        close_quietly(client, cluster)
    volatile = set(study.volatile)
    _check(
        "study_cluster",
        _same(_stable(spread, volatile), _stable(records, volatile)),
        "two workers give other records than one process",
    )


#: The checks, in the order they run.
STUDY_CHECKS = {
    "study_units": study_units,
    "study_resume": study_resume,
    "study_other_setting": study_other_setting,
    "study_summary": study_summary,
    "study_cluster": study_cluster,
}


def check_study(make_study, *, checks=None, directory=None) -> list:
    """Run the study contract's checks (``STUDY_CHECKS``, or those named in ``checks``) on the studies
    ``make_study()`` builds (a fresh one each time: a check runs it more than once). Records files go to a
    temporary directory (or ``directory``). Returns the names of the checks run; a failure raises an
    AssertionError naming its check.

    Examples
    --------
    >>> from cactus_theory.testing import check_study
    >>> callable(check_study)
    True
    """
    names = list(STUDY_CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in STUDY_CHECKS]
    if unknown:
        raise ValueError(f"checks: unknown {unknown}; the checks are {', '.join(STUDY_CHECKS)}")
    if not isinstance(make_study(), Study):
        raise TypeError("make_study must build a Study (a subclass of cactus_theory.Study)")
    with tempfile.TemporaryDirectory(dir=directory) as work:
        records = run_study(make_study(), out=os.path.join(work, "reference.jsonl"), progress=False)
        for name in names:
            STUDY_CHECKS[name](make_study, work, records)
    return names
