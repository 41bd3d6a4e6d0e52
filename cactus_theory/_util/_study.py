"""Every long run is a study, and one runner runs them all (``run_study``).

A study (``Study``) says what it is and nothing about how it is run:

- its ``kind`` (the name its records carry) and its **setting**, which it does not write: the setting is derived
  (``Study.setting``) from every public attribute the study holds (so a field that decides records cannot be left
  out by forgetting it), less those it names in ``outside_setting`` with why each decides no record (the units'
  list, CPU threads, the rules each record names), plus what ``prepare()`` says of what it loaded (the models'
  weights and arithmetic): lm-evaluation-harness keys its cache on the request itself the same way;
- ``prepare()``: what the run needs in each process that runs units (models, decoders), made once per process (a
  Dask worker prepares its own copy), returning the facts of it that decide records (JSON-able);
- its ``units()``: the pieces of work, in order (problems, groups of prompts, contexts), each small and
  picklable, and the keys of the records a unit gives (``unit_keys``; ``key`` of a record);
- how one unit runs to its records (``run_unit(unit, held)``): a function of the unit, the setting and the
  records of that unit already held (``held``: {key: record}; a unit asked again gives exactly the records it
  lacks), that a Dask worker can run as well as this process;
- how records summarise to a result (``summarize(records, **options)``): a function of the records and the options
  it declares (``summary_options``, with their defaults), so that a command passes its options there and never
  summarises around it.

The runner owns the rest, once for every study: the record log (``RecordLog``: the file locked, a record of
another kind or setting refused before anything runs), resume (a unit whose records are all held is skipped), the
progress bar, the study's own context around the work (``running()``: the CPU threads of its models, said in
the progress line), each record's share of its unit's wall time (``RUN_SECONDS``: their sum over a file is the
time its runs spent, ``run_seconds``), the interruption line on Ctrl-C / SIGTERM / SIGHUP (``resumable_run``: what
is kept, how to resume), and the spread over a Dask cluster (``client``: the study is sent to the workers once,
``for_worker()`` there, prepared once per worker; units go out as tasks and their records come back here, into the
one log, as each completes: ``_cluster.map_tasks``, the one mapper of studies and analyses). ``check_study``
(``cactus_theory.testing``) checks that a study keeps this contract, and says which checks could not run.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import numbers
import os
import time
from typing import ClassVar, final

from ._progress import progress_bar
from ._records import open_records, resumable_run

__all__ = ["RUN_SECONDS", "Study", "identity_of", "run_seconds", "run_study", "setting_fields", "stamp"]

#: The field the runner adds to every record: its share of its unit's wall time, in seconds (the unit's time over
#: the records it gave), so that their sum over a file is the time its runs spent. Never compared between runs.
RUN_SECONDS = "run_seconds"


def identity_of(value, where="value"):
    """``value`` as a setting holds it (JSON's types): numbers, strings, None and booleans as they are; lists,
    tuples and dicts item by item; a path as its string; an object by what it says of itself (``as_dict()``,
    a rule's ``describe()``), a dataclass by its fields. Anything else is a TypeError naming ``where``: a study
    names such an attribute in ``outside_setting`` (with why it decides no record) or gives it ``as_dict()``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return identity_of(value.item(), where)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [identity_of(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): identity_of(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    for method in ("as_dict", "describe"):
        if callable(getattr(value, method, None)):
            return identity_of(getattr(value, method)(), where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: identity_of(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
    raise TypeError(
        f"{where}: a {type(value).__name__} has no identity for a study's setting: name it in outside_setting "
        "(with why it decides no record), keep it under a leading underscore, or give it as_dict()"
    )


def setting_fields(study) -> dict:
    """The part of ``study``'s setting its attributes give: every public attribute (no leading underscore) but
    those named in ``outside_setting``, by ``identity_of``, sorted by name."""
    outside = type(study).outside_setting
    return {
        name: identity_of(value, f"{type(study).__name__}.{name}")
        for name, value in sorted(vars(study).items())
        if not name.startswith("_") and name not in outside
    }


class Study(abc.ABC):
    """The interface of a long run (see the module docstring). Subclass it and give ``kind``, ``units``,
    ``unit_keys``, ``key``, ``run_unit`` and ``summarize``; ``outside_setting`` (the attributes that decide no
    record, each with why), ``prepare`` (what each process loads once, and the facts of it that decide records),
    ``summary_options``, ``running`` (a context around the work, yielding what the progress line says of it),
    ``check_held`` (checks of held records beyond their setting), ``for_worker`` (what a Dask worker runs) and
    ``close`` where the study needs them. Never write ``setting()``: it is derived from the study's attributes."""

    #: The kind of record it writes (the ``record`` field): a file of another kind is refused.
    kind: ClassVar[str] = ""
    #: What one unit is called in the progress line.
    unit_name: ClassVar[str] = "unit"
    #: Record fields a rerun may give differently (timings, the machine's load): ``check_study`` compares the
    #: rest of each record (``RUN_SECONDS`` always apart).
    volatile: ClassVar[tuple] = ()
    #: {attribute or parameter of ``__init__``: why it decides no record}: every other public attribute is the
    #: setting. ``check_study`` runs a unit with each such attribute changed (where it can) and fails the study
    #: when the records change.
    outside_setting: ClassVar[dict] = {}
    #: {parameter of ``__init__``: the public attribute that holds it under another name} (e.g. the sampling
    #: settings kept as ``sampling``): ``check_study`` finds every parameter held.
    setting_as: ClassVar[dict] = {}
    #: {option: default} that ``summarize`` takes as keywords (a bootstrap's draws, its seed, a level).
    summary_options: ClassVar[dict] = {}

    @final
    def setting(self) -> dict:
        """What decides every record besides its key (JSON-able): the study's public attributes but those
        ``outside_setting`` names (``setting_fields``), and the facts ``prepare()`` gives (prepared first, once in
        this process). Records of another setting are refused."""
        fields = setting_fields(self)
        facts = self.prepared()
        both = sorted(set(fields) & set(facts))
        if both:
            raise TypeError(f"{type(self).__name__}: prepare() gives {both[0]!r}, which an attribute gives too")
        return {**fields, **facts}

    def prepare(self) -> dict:
        """Load what the units need in this process (models, decoders; kept under leading underscores) and return
        the facts of it that decide records (the models' identities, their arithmetic). Run once per process,
        before the first unit there; default: nothing to load."""
        return {}

    @final
    def prepared(self) -> dict:
        """``prepare()``'s facts, preparing this process's copy of the study the first time."""
        facts = self.__dict__.get("_prepared_facts")
        if facts is None:
            facts = self.prepare()
            facts = {} if facts is None else facts
            if not isinstance(facts, dict):
                raise TypeError(f"{type(self).__name__}.prepare() must return a dict of facts (or None)")
            facts = identity_of(facts, f"{type(self).__name__}.prepare()")
            self.__dict__["_prepared_facts"] = facts
        return facts

    @abc.abstractmethod
    def units(self) -> list:
        """The units, in the order the records are returned."""

    @abc.abstractmethod
    def unit_keys(self, unit) -> list:
        """The keys of the records ``unit`` gives, in order."""

    @abc.abstractmethod
    def key(self, record) -> tuple:
        """A record's key (``unit_keys`` of its unit lists it)."""

    @abc.abstractmethod
    def run_unit(self, unit, held: dict) -> list:
        """The records of ``unit`` that ``held`` ({key: record} of that unit, already kept) lacks, and no other."""

    @abc.abstractmethod
    def summarize(self, records, **options):
        """The study's result (a ``Result``) from its records and ``options`` (``summary_options``) alone."""

    def check_held(self, records) -> None:
        """Refuse, in one ValueError line, held records this study must not resume from (beyond their kind and
        setting, which the log checks): e.g. another problem under the same id."""
        return None

    @contextlib.contextmanager
    def running(self):
        """The context of the work (in this process, and around each unit on a worker): yields what the
        progress line says of it (e.g. the CPU threads)."""
        yield ""

    def for_worker(self):
        """What a Dask worker runs: this study, or a form of it that loads its models there (default: itself)."""
        return self

    def close(self) -> None:
        """Free what the run held (caches, sequences)."""
        return None

    @property
    def label(self) -> str:
        """The progress line's name of the study."""
        return self.kind

    def __getstate__(self):
        """What a study keeps for itself while it runs (attributes named with a leading underscore: loaded
        models, decoders, caches, what it prepared) stays in the process that made it: a copy sent to a worker
        (or from one worker to another, while it runs there) carries the study's definition alone."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


def stamp(kind: str, setting: dict, record: dict) -> dict:
    """``record`` as a log of ``kind`` writes it: ``record`` first, ``setting`` last."""
    body = {k: v for k, v in record.items() if k not in ("record", "setting")}
    return {"record": kind, **body, "setting": setting}


def run_seconds(records) -> float:
    """The seconds the runs that made ``records`` spent on them (the sum of their ``RUN_SECONDS``; records made
    before the runner kept it count 0)."""
    total = 0.0
    for rec in records:
        value = rec.get(RUN_SECONDS) if isinstance(rec, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            total += float(value)
    return total


def _timed_unit(study, unit, held) -> list:
    """``run_unit`` of a prepared study, each record given its share of the unit's wall time."""
    study.prepared()
    t0 = time.perf_counter()
    records = study.run_unit(unit, held)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise TypeError(f"{type(study).__name__}.run_unit must return a list of records (dicts)")
    share = (time.perf_counter() - t0) / max(len(records), 1)
    return [{**r, RUN_SECONDS: round(share, 6)} for r in records]


def _setting_on_worker(study) -> dict:
    return study.setting()


def _unit_on_worker(study, unit, held) -> list:
    with study.running():
        return _timed_unit(study, unit, held)


def run_study(study: Study, *, out=None, progress=None, client=None) -> list:
    """Run ``study``: its records, in the order of its units (each unit's in its ``unit_keys`` order), those
    already in ``out`` included. ``out``: the records file (JSON Lines; resumed, locked, refused when it holds
    another kind or setting; None: the records are only returned). ``client``: a ``distributed.Client`` to
    spread the units over (the setting is asked of one worker first, so every argument is checked where the
    models are). ``progress``: the bar (True, False, or None: on a terminal). Ctrl-C and SIGTERM stop it with
    one line saying what is kept; the same call resumes."""
    if not isinstance(study, Study):
        raise TypeError(f"run_study runs a Study; got {type(study).__name__}")
    remote = None
    if client is not None:
        remote = client.scatter(study.for_worker(), broadcast=True, hash=False)
        setting = client.submit(_setting_on_worker, remote, pure=False).result()
    else:
        setting = study.setting()
    log, held = open_records(out, study.kind, setting)
    try:
        done = {study.key(r): r for r in held}
        study.check_held(held)
        units = study.units()
        todo = [u for u in units if any(k not in done for k in study.unit_keys(u))]
        fresh = [0]

        def keep(records):
            records = [r for r in records if study.key(r) not in done]
            if log is not None:
                if records:
                    log.append(records)
                records = [log.stamped(r) for r in records]
            else:
                records = [stamp(study.kind, setting, r) for r in records]
            for rec in records:
                done[study.key(rec)] = rec
            fresh[0] += len(records)

        with (
            resumable_run(out, lambda: f"{fresh[0]} record(s) of this run kept") as run,
            contextlib.nullcontext("") if client is not None else study.running() as line,
        ):
            where = "on the cluster" if client is not None else line
            desc = f"{study.label} ({where})" if where else study.label
            bar = run.bar = progress_bar(total=len(todo), desc=desc, unit=study.unit_name, enabled=progress)

            def held_of(unit):
                return {k: done[k] for k in study.unit_keys(unit) if k in done}

            if client is None:
                for unit in todo:
                    keep(_timed_unit(study, unit, held_of(unit)))
                    bar.update(1)
            else:
                from ._cluster import map_tasks

                def arrived(_, records):
                    keep(records)
                    bar.update(1)

                map_tasks(client, _unit_on_worker, [(remote, u, held_of(u)) for u in todo], arrived)
            bar.close()
        missing = [k for u in units for k in study.unit_keys(u) if k not in done]
        if missing:
            raise RuntimeError(f"{study.label}: a unit gave no record for {missing[0]!r}: the study is broken")
        return [done[k] for u in units for k in study.unit_keys(u)]
    finally:
        if log is not None:
            log.close()
        study.close()
