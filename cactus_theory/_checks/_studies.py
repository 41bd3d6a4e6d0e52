"""``check_study``: the contract every long run keeps, checked on any study (scikit-learn's ``check_estimator`` for
studies): a study of the package's and a user's alike. Each check is a named function; a failure is an
AssertionError that names it; a check that cannot run on a study says so (``"skipped: why"``), never passes.

- ``study_units``: units and keys are well formed: at least one unit, no key in two units, every record the
  run returns under a key of its unit;
- ``study_setting``: the setting is the study's own (derived from its attributes: ``setting()`` is not written by
  the study), every parameter of its ``__init__`` is held (a public attribute of its name, one ``setting_as``
  names, or one ``outside_setting`` says decides no record, with why), and each attribute said to decide no record
  really does not: the first unit run with it changed (an integer by one, a number doubled, a flag flipped) gives
  the same records;
- ``study_partly_held``: a unit whose first record is held gives exactly the records it lacks, the same as an
  uninterrupted run's (skipped where every unit gives one record);
- ``study_resume``: a run stopped after its first unit (Ctrl-C) and run again gives the records an
  uninterrupted run gives (fields the study declares ``volatile``, timings, apart);
- ``study_other_setting``: a records file the same study made with one field of its setting changed is refused,
  and left as it was;
- ``study_summary``: the summary is a function of the records and its declared options alone: the same from the
  records returned, read back from the file, or in another order, with its options' defaults given or not, and it
  changes none of them;
- ``study_cluster``: a Dask cluster of two worker processes gives the records one process gives (skipped where
  ``distributed`` is not installed, or the study cannot be sent to a worker: models loaded in this process).
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import pickle
import random
import tempfile

from .._math._validation import is_integer
from .._util._study import RUN_SECONDS, Study, run_study, setting_fields, stamp

__all__ = ["STUDY_CHECKS", "check_study"]


class _Skip(Exception):
    """A check that cannot run on this study: why."""


def _stable(value, volatile):
    """``value`` without the ``volatile`` fields (and the runner's ``RUN_SECONDS``), at any depth."""
    if isinstance(value, dict):
        return {k: _stable(v, volatile) for k, v in value.items() if k not in volatile and k != RUN_SECONDS}
    if isinstance(value, list):
        return [_stable(v, volatile) for v in value]
    return value


def _bodies(records, volatile) -> list:
    """What a unit gave of each record, as JSON reads it back: the runner's stamp (``record``, ``setting``,
    ``RUN_SECONDS``) and the ``volatile`` fields apart."""
    return [_stable({k: v for k, v in _json(r).items() if k not in ("record", "setting")}, volatile) for r in records]


def _same(a, b) -> bool:
    """Equal as JSON reads them, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _json(value):
    return json.loads(json.dumps(value, default=str))


def _rows(result):
    """A summary as comparable data: a result's records (and its table), or the value itself."""
    if hasattr(result, "records") and callable(result.records):
        return {"records": _json(result.records()), "table": result.table()}
    return _json(result)


def _read(path) -> list:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _check(name, condition, why):
    if not condition:
        raise AssertionError(f"{name}: {why}")


def _run_alone(study, unit, held) -> list:
    """``run_unit`` of ``study`` on ``unit`` in this process, as the runner runs it (prepared, in its context)."""
    study.prepared()
    with study.running():
        return study.run_unit(unit, dict(held))


def _changed(value):
    """Another value of the same kind (an integer by one, a number doubled, a flag flipped), or None."""
    if isinstance(value, bool):
        return not value
    if is_integer(value):
        return value + 1
    if isinstance(value, float) and math.isfinite(value):
        return 2 * value + 1.0
    return None


def _variant(study, key, value):
    """A copy of ``study`` (its prepared models shared) with ``key`` set to ``value``."""
    variant = copy.copy(study)
    setattr(variant, key, value)
    return variant


def _parameters(study) -> list:
    """The named parameters of the study's ``__init__`` (not ``*args`` / ``**kwargs``)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(type(study).__init__).parameters.values() if p.kind in kinds][1:]


def _first_unit_records(study, records):
    unit = study.units()[0]
    keys = study.unit_keys(unit)
    return unit, [r for r in records if study.key(r) in keys]


def study_units(make_study, work, records) -> str:
    study = make_study()
    units = study.units()
    _check("study_units", len(units) > 0, "the study has no unit")
    keys = [k for u in units for k in study.unit_keys(u)]
    _check("study_units", len(set(keys)) == len(keys), "a key is listed by two units (or twice by one)")
    got = [study.key(r) for r in records]
    _check("study_units", got == keys, "the run's records are not one per key, in the units' order")
    return "passed"


def study_setting(make_study, work, records) -> str:
    study = make_study()
    name = type(study).__name__
    _check(
        "study_setting",
        type(study).setting is Study.setting,
        f"{name} writes its own setting(): the setting is derived from the study's attributes (name what decides "
        "no record in outside_setting, what a model says of itself in prepare())",
    )
    outside, held_as = dict(type(study).outside_setting), dict(type(study).setting_as)
    params = _parameters(study)
    for key, why in outside.items():
        _check(
            "study_setting",
            isinstance(why, str) and why.strip(),
            f"outside_setting[{key!r}] must say why it decides no record",
        )
        _check(
            "study_setting",
            key in vars(study) or key in params,
            f"outside_setting names {key!r}, neither an attribute of {name} nor a parameter of its __init__",
        )
    fields = setting_fields(study)
    for param in params:
        kept = param in fields or param in outside or held_as.get(param) in fields
        _check(
            "study_setting",
            kept,
            f"the parameter {param!r} of {name}.__init__ is not held: keep it as a public attribute of its name (it "
            f"then is the setting), say in setting_as which attribute holds it, or in outside_setting why it decides "
            "no record",
        )
    unit, reference = _first_unit_records(study, records)
    volatile = set(study.volatile)
    unchecked = []
    for key in outside:
        value = vars(study).get(key)
        other = _changed(value)
        if key not in vars(study) or other is None:
            unchecked.append(key)
            continue
        try:
            again = _run_alone(_variant(study, key, other), unit, {})
        except Exception as exc:  # the changed value is not one the study takes: nothing learnt
            unchecked.append(f"{key} ({type(exc).__name__} at {other!r})")
            continue
        _check(
            "study_setting",
            _same(_bodies(again, volatile), _bodies(reference, volatile)),
            f"{key} is said to decide no record ({outside[key]}), yet the first unit run with {key}={other!r} gives "
            f"other records than with {key}={value!r}: keep it in the setting",
        )
    return "passed" + (f" (not varied: {', '.join(unchecked)})" if unchecked else "")


def study_partly_held(make_study, work, records) -> str:
    study = make_study()
    volatile = set(study.volatile)
    by_key = {study.key(r): r for r in records}
    unit = next((u for u in study.units() if len(study.unit_keys(u)) > 1), None)
    if unit is None:
        raise _Skip("every unit gives one record: none can be partly held")
    keys = study.unit_keys(unit)
    held = {keys[0]: by_key[keys[0]]}
    got = _run_alone(study, unit, held)
    _check(
        "study_partly_held",
        [study.key(r) for r in got] == keys[1:],
        f"a unit whose record {keys[0]!r} is held gave the records of {[study.key(r) for r in got]!r}, not of the "
        f"{len(keys) - 1} it lacks",
    )
    _check(
        "study_partly_held",
        _same(_bodies(got, volatile), _bodies([by_key[k] for k in keys[1:]], volatile)),
        "a unit partly held gives other records than the same unit run whole",
    )
    return "passed"


def study_resume(make_study, work, records) -> str:
    study = make_study()
    volatile = set(study.volatile)
    out = os.path.join(work, "resumed.jsonl")
    calls = [0]
    cls = type(study)

    def stop_after_first(self, unit, held):
        calls[0] += 1
        if calls[0] > 1:
            raise KeyboardInterrupt  # as Ctrl-C would, between two units
        return cls.run_unit(self, unit, held)

    study.__class__ = type(cls.__name__, (cls,), {"run_unit": stop_after_first})
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
    return "passed"


def study_other_setting(make_study, work, records) -> str:
    study = make_study()
    path = os.path.join(work, "other.jsonl")
    fields = setting_fields(study)
    unit, _ = _first_unit_records(study, records)
    variant, changed = None, None
    for key in fields:
        other = _changed(getattr(study, key))
        if other is not None:
            variant, changed = _variant(study, key, other), f"{key}={other!r}"
            break
    if variant is not None:
        try:
            theirs = [stamp(study.kind, variant.setting(), r) for r in _run_alone(variant, unit, {})]
        except Exception:  # a value the study does not take: forge the setting instead
            variant = None
    if variant is None:
        theirs = [{**rec, "setting": {"another": "setting"}} for rec in records[:1]]
        changed = "a setting of another study"
    with open(path, "w") as fh:
        for rec in theirs:
            fh.write(json.dumps(rec) + "\n")
    before = open(path, "rb").read()
    try:
        run_study(study, out=path, progress=False)
    except ValueError as exc:
        _check("study_other_setting", "another setting" in str(exc), f"refused with another message: {exc}")
    else:
        raise AssertionError(f"study_other_setting: a records file made with {changed} was resumed")
    _check("study_other_setting", open(path, "rb").read() == before, "the refused file was changed")
    return "passed"


def study_summary(make_study, work, records) -> str:
    study = make_study()
    kept = copy.deepcopy(records)
    first = _rows(study.summarize(records))
    _check("study_summary", _same(records, kept), "summarize changed the records it was given")
    shuffled = list(records)
    random.Random(0).shuffle(shuffled)
    _check("study_summary", _same(_rows(study.summarize(shuffled)), first), "the summary depends on the order")
    options = dict(type(study).summary_options)
    if options:
        _check(
            "study_summary",
            _same(_rows(study.summarize(records, **options)), first),
            f"the summary with its declared defaults {options} differs from the summary without options",
        )
    path = os.path.join(work, "summary.jsonl")
    run_study(make_study(), out=path, progress=False)
    from_file = _read(path)
    if not study.volatile:
        _check("study_summary", _same(_rows(study.summarize(from_file)), first), "the file's records summarise apart")
    _check("study_summary", _same(_rows(make_study().summarize(records)), first), "a second study summarises apart")
    return "passed"


def study_cluster(make_study, work, records) -> str:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise _Skip("distributed is not installed (the distributed extra)") from None
    study = make_study()
    try:
        pickle.dumps(study.for_worker())
    except Exception as exc:
        raise _Skip(f"the study cannot be sent to a worker ({str(exc).splitlines()[0][:120]})") from None
    from .._util._cluster import close_quietly, local_dask_cluster

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
    return "passed"


#: The checks, in the order they run.
STUDY_CHECKS = {
    "study_units": study_units,
    "study_setting": study_setting,
    "study_partly_held": study_partly_held,
    "study_resume": study_resume,
    "study_other_setting": study_other_setting,
    "study_summary": study_summary,
    "study_cluster": study_cluster,
}


def check_study(make_study, *, checks=None, directory=None) -> dict:
    """Run the study contract's checks (``STUDY_CHECKS``, or those named in ``checks``) on the studies
    ``make_study()`` builds (a fresh one each time: a check runs it more than once). Records files go to a
    temporary directory (or ``directory``). Returns {check: outcome}, in order: ``"passed"`` (with what could not
    be varied said after it), or ``"skipped: why"`` where the check cannot run on this study (a skipped check is
    not a pass); a failure raises an AssertionError naming its check.

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
    report = {}
    with tempfile.TemporaryDirectory(dir=directory) as work:
        records = run_study(make_study(), out=os.path.join(work, "reference.jsonl"), progress=False)
        for name in names:
            try:
                report[name] = STUDY_CHECKS[name](make_study, work, records)
            except _Skip as why:
                report[name] = f"skipped: {why}"
    return report
