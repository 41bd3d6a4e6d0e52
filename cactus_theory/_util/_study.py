"""Every long run is a study, and one runner runs them all (``run_study``).

A study (``Study``) says four things and nothing about how it is run:

- what it is: its ``kind`` (the name its records carry) and its ``setting()`` (everything that decides its
  records besides each record's own key: the models, their arithmetic, the sampling, the lengths...);
- its ``units()``: the pieces of work, in order (problems, groups of prompts, contexts), each small and
  picklable, and the keys of the records a unit gives (``unit_keys``; ``key`` of a record);
- how one unit runs to its records (``run_unit(unit, held)``): a function of the unit, the setting and the
  records of that unit already held (``held``: {key: record}; a unit asked again gives the records it lacks),
  that a Dask worker can run as well as this process;
- how records summarise to a result (``summarize(records)``): a function of the records alone.

The runner owns the rest, once for every study: the record log (``RecordLog``: the file locked, a record of
another kind or setting refused before anything runs), resume (a unit whose records are all held is skipped), the
progress bar, the study's own context around the work (``running()``: the CPU threads of its models, said in
the progress line), the interruption line on Ctrl-C / SIGTERM / SIGHUP (``resumable_run``: what is kept, how to
resume), and the spread over a Dask cluster (``client``: the study is sent to the workers once, ``for_worker()``
there: it loads what it needs once per worker; units go out as tasks and their records come back here, into the
one log, as each completes). ``check_study`` (``cactus_theory.testing``) checks that a study keeps this contract.
"""

from __future__ import annotations

import abc
import contextlib
from typing import ClassVar

from ._progress import progress_bar
from ._records import open_records, resumable_run

__all__ = ["Study", "run_study", "stamp"]


class Study(abc.ABC):
    """The interface of a long run (see the module docstring). Subclass it and give ``kind``, ``setting``,
    ``units``, ``unit_keys``, ``key``, ``run_unit`` and ``summarize``; ``running`` (a context around the
    work, yielding what the progress line says of it), ``check_held`` (checks of held records beyond their
    setting), ``for_worker`` (what a Dask worker runs) and ``close`` where the study needs them."""

    #: The kind of record it writes (the ``record`` field): a file of another kind is refused.
    kind: ClassVar[str] = ""
    #: What one unit is called in the progress line.
    unit_name: ClassVar[str] = "unit"
    #: Record fields a rerun may give differently (timings, the machine's load): ``check_study`` compares the
    #: rest of each record.
    volatile: ClassVar[tuple] = ()

    @abc.abstractmethod
    def setting(self) -> dict:
        """What decides every record besides its key (JSON-able); records of another setting are refused."""

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
        """The records of ``unit`` that ``held`` ({key: record} of that unit, already kept) lacks."""

    @abc.abstractmethod
    def summarize(self, records):
        """The study's result (a ``Result``) from its records alone."""

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
        models, decoders, caches) stays in the process that made it: a copy sent to a worker (or from one
        worker to another, while it runs there) carries the study's definition alone."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


def stamp(kind: str, setting: dict, record: dict) -> dict:
    """``record`` as a log of ``kind`` writes it: ``record`` first, ``setting`` last."""
    body = {k: v for k, v in record.items() if k not in ("record", "setting")}
    return {"record": kind, **body, "setting": setting}


def _setting_on_worker(study) -> dict:
    return study.setting()


def _unit_on_worker(study, unit, held) -> list:
    with study.running():
        return study.run_unit(unit, held)


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
            if client is None:
                for unit in todo:
                    mine = {k: done[k] for k in study.unit_keys(unit) if k in done}
                    keep(study.run_unit(unit, mine))
                    bar.update(1)
            else:
                from distributed import as_completed

                futures = [
                    client.submit(
                        _unit_on_worker, remote, unit, {k: done[k] for k in study.unit_keys(unit) if k in done}
                    )
                    for unit in todo
                ]
                try:
                    for future in as_completed(futures):
                        keep(future.result())
                        bar.update(1)
                finally:
                    client.cancel(futures)
            bar.close()
        missing = [k for u in units for k in study.unit_keys(u) if k not in done]
        if missing:
            raise RuntimeError(f"{study.label}: a unit gave no record for {missing[0]!r}: the study is broken")
        return [done[k] for u in units for k in study.unit_keys(u)]
    finally:
        if log is not None:
            log.close()
        study.close()
