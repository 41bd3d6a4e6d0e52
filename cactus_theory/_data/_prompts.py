"""Prompts from any file (JSON Lines, JSON, CSV / TSV, plain text) and the benchmark loaders
(GSM8K, HumanEval, MBPP, MT-Bench, Spec-Bench), chosen explicitly, reading a data directory the
user gives (``--data``, ``$CACTUS_THEORY_DATA``, or ``~/.cache/cactus_theory/data``).
A prompt keeps a reference to its source (task, index, sha256 of the text), so a trace can
point at it without carrying the text or its token ids."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os

import numpy as np

from .._math._validation import check_int
from .._util._files import json_lines, read_text
from ._benchmarks import DATA_ENV, benchmark_file, benchmark_names, data_directory, get_benchmark
from ._prompt import Prompt

__all__ = [
    "BENCHMARKS",
    "DATASETS",
    "DATA_ENV",
    "PROMPT_FIELDS",
    "RECORD_FORMATS",
    "Prompt",
    "benchmark_file",
    "benchmark_prompt",
    "data_directory",
    "load_prompts",
    "mixed_prompts",
    "prompt_part",
    "prompt_seed",
    "select_part",
]

#: Fields (JSON keys, CSV columns) tried in order when ``field`` is not given.
PROMPT_FIELDS = ("prompt", "text", "question", "turns")
RECORD_FORMATS = """\
Prompt files: JSON Lines (.jsonl, .jsonl.gz: one object or string per line), JSON (.json: a
list of objects or strings), CSV / TSV (.csv, .tsv: a header row) or plain text (any other
extension: one prompt per line, blank lines skipped). The text is the field --field (JSON key
or CSV column); by default the first of prompt, text, question, turns that a record has
("turns": its first element). A prompt's task is its record's own task field (--task-field,
default "task") where the record has one, else the file's name without its extensions; --task
labels them all. Prompt ids are TASK-INDEX. --dataset gsm8k|humaneval|mbpp|mt_bench|spec_bench
reads a benchmark file in its own format, with the instruction the paper's setup uses."""

#: The package's own benchmarks whose files ``--dataset`` reads (``datasets()``: any registered now).
DATASETS = benchmark_names(plugins=False)
#: Each benchmark's file inside the data directory, and where to get it (the package's own; ``get_benchmark``
#: answers for any).
BENCHMARKS = {
    name: (get_benchmark(name).file, get_benchmark(name).source)
    for name in DATASETS
    if get_benchmark(name).file is not None
}


def datasets() -> tuple:
    """The benchmarks registered now (the package's and any a user registered): ``--dataset``'s choices."""
    return benchmark_names()


def prompt_seed(seed: int, prompt_id: str) -> int:
    """The sampling seed of one prompt: from the user's seed and the prompt's id only (sha256 of
    the id), so a resumed, limited or reordered dump samples every prompt exactly as a full one."""
    check_int(seed, "seed", 0, what="the sampling seed")
    digest = hashlib.sha256(str(prompt_id).encode("utf-8")).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return int(np.random.SeedSequence([int(seed), *words]).generate_state(1, dtype=np.uint64)[0] >> 1)


def prompt_part(prompt_id: str, parts: int) -> int:
    """The part (1..parts) a prompt belongs to in a split dump: from its id only (sha256), so
    every host computes the same split whatever order or subset of prompts it reads."""
    check_int(parts, "parts", 1)
    digest = hashlib.sha256(b"part:" + str(prompt_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % int(parts) + 1


def select_part(prompts, part: int, parts: int):
    """The prompts of part ``part`` of ``parts`` (1-based; ``prompt_part``), in their order.
    The parts of one prompt list are disjoint and together hold every prompt."""
    check_int(parts, "parts", 1)
    check_int(part, "part", 1, high=parts)
    return [p for p in prompts if prompt_part(p.id, parts) == part]


def benchmark_prompt(dataset: str, rec: dict) -> str:
    """The user message for one record of a benchmark file: the text, with the instruction the paper's
    setup uses (GSM8K: step by step, answer after '####'; HumanEval: the whole function in one code
    block; MBPP: code passing the first test; MT-Bench and Spec-Bench: the first turn): the benchmark's
    own ``prompt`` (``get_benchmark``)."""
    if not isinstance(rec, dict):
        raise ValueError(f"a {dataset} record is a JSON object; got {type(rec).__name__}")
    return get_benchmark(dataset).prompt(rec)


def _short(value, limit=60) -> str:
    shown = repr(value)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _stem(path: str) -> str:
    name = os.path.basename(path)
    for ext in (".gz", ".jsonl", ".json", ".csv", ".tsv", ".txt"):
        if name.lower().endswith(ext):
            name = name[: -len(ext)]
    return name or "prompts"


def _pick(record, field, where):
    """The prompt text of one record (a string, or a mapping with ``field`` or a default field)."""
    if isinstance(record, str):
        if field is not None:
            raise ValueError(f"{where}: a plain string, so --field {field!r} does not apply")
        value = record
    elif isinstance(record, dict):
        names = (field,) if field is not None else PROMPT_FIELDS
        key = next((k for k in names if k in record), None)
        if key is None:
            wanted = f"field {field!r}" if field is not None else f"any of the fields {', '.join(PROMPT_FIELDS)}"
            raise ValueError(
                f"{where}: no {wanted}; the record has {', '.join(map(str, record)) or 'no fields'}: "
                "pass --field NAME (field= in Python)"
            )
        value = record[key]
        if isinstance(value, list):  # a conversation: its first turn
            value = value[0] if value else ""
    else:
        raise ValueError(f"{where}: expected a JSON object or string, got {type(record).__name__}")
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: the prompt text is empty or not a string ({value!r})")
    return _unicode(value, where)


def _unicode(text: str, where: str) -> str:
    """``text`` if it is valid Unicode; a lone surrogate (a JSON escape such as \\ud800 without its
    pair) raises a ValueError naming where it is, before a tokenizer fails on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{where}: the prompt text holds an unpaired surrogate ({text[exc.start]!r} at character "
            f"{exc.start}), which is not valid Unicode: fix the \\u escapes of that record"
        ) from None
    return text


def _record_label(record, field, what, where, fix):
    """A record's own label in ``field`` (a task or an id: a non-empty string or integer, at most
    100 characters, no slashes or line breaks), or None where it has none."""
    if field is None or not isinstance(record, dict) or field not in record:
        return None
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise ValueError(f"{where}: the {what} field {field!r} must be a non-empty string or integer; got {value!r}")
    label = str(value).strip()
    if len(label) > 100 or any(c in label for c in "/\\\n\r\t") or label != _unicode(label, where):
        raise ValueError(
            f"{where}: the {what} {label[:40]!r} is not a label (at most 100 characters, no slashes or "
            f"line breaks){fix}"
        )
    return label


def _record_task(record, task_field, where):
    """The record's own task label (its ``task_field``), or None where it has none."""
    return _record_label(record, task_field, "task", where, "")


def _record_id(record, id_field, where):
    """The record's own id (its ``id_field``) as a label, or None where it has none."""
    fix = "; pass --id-field with another field, or none to number the records"
    return _record_label(record, id_field, "id", where, fix)


def _generic_records(path, field, task_field=None, id_field=None):
    """(index, text, the record's own task or None, its own id or None) of every record of a
    prompt file in any of the RECORD_FORMATS."""
    low = path.lower()

    def one(i, rec, where):
        return i, _pick(rec, field, where), _record_task(rec, task_field, where), _record_id(rec, id_field, where)

    if low.endswith((".jsonl", ".jsonl.gz")):
        return [one(i, rec, f"{path}, line {n}") for i, (n, rec) in enumerate(json_lines(path))]
    if low.endswith((".json", ".json.gz")):
        try:
            data = json.loads(read_text(path))
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}); a .json prompt file is one list"
            ) from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json prompt file must hold a list of records or strings")
        return [one(i, rec, f"{path}, record {i}") for i, rec in enumerate(data)]
    if low.endswith((".csv", ".tsv", ".csv.gz", ".tsv.gz")):
        tab = low.endswith((".tsv", ".tsv.gz"))
        reader = csv.DictReader(io.StringIO(read_text(path), newline=""), delimiter="\t" if tab else ",")
        return [one(i, dict(row), f"{path}, row {i + 2}") for i, row in enumerate(reader)]
    if field is not None:
        raise ValueError(f"{path}: a plain text file has one prompt per line; --field applies to JSON and CSV")
    lines = read_text(path).split("\n")
    return [
        (i, _unicode(text, f"{path}, line {n}"), None, None)
        for i, (n, text) in enumerate((n, line.rstrip("\r")) for n, line in enumerate(lines, 1) if line.strip())
    ]


def load_prompts(
    path,
    dataset: str | None = None,
    limit: int | None = None,
    start: int = 0,
    *,
    field=None,
    task=None,
    task_field="task",
    id_field="id",
) -> list[Prompt]:
    """Prompts from one file.

    Without ``dataset``, any file in the ``RECORD_FORMATS``: JSON Lines, JSON, CSV / TSV or plain
    text, the text from ``field`` (default: the first of ``PROMPT_FIELDS`` present), each
    labelled by its own ``task_field`` (a JSON key or CSV column, default ``"task"``) where the
    record has one, else by the file's stem; ``task`` labels every prompt of the file and
    overrides both (``task_field=None`` ignores the records' fields). Prompt ids are TASK-ID
    where a record has its own ``id_field`` (default ``"id"``; ids repeated in one file are
    refused), so reordering the file changes no prompt's id nor its seed; else TASK-INDEX, the
    index of the record in the file (``id_field=None`` always numbers). With ``dataset`` (one
    of ``DATASETS``), the benchmark's own format and instruction (e.g. GSM8K's "Solve the
    problem step by step ..."); the dataset is never guessed from the path. A record without the
    field, invalid JSON or an empty prompt raise a ValueError naming the file and line.
    """
    path = str(path)
    if os.path.isdir(path):
        raise ValueError(f"prompt file {path!r} is a directory: give the prompt files inside it")
    if not os.path.exists(path):
        raise ValueError(f"prompt file {path!r} does not exist")
    if limit is not None:
        check_int(limit, "limit", 0)
    if dataset is not None:
        if dataset not in datasets():
            raise ValueError(f"dataset must be one of {datasets()} (or None for any prompt file); got {dataset!r}")
        label = task or dataset
        records = []
        for i, (n, rec) in enumerate(json_lines(path)):
            try:
                records.append((i, _unicode(benchmark_prompt(dataset, rec), f"{path}, line {n}")))
            except ValueError as exc:
                if str(exc).startswith(f"{path}, line"):
                    raise
                raise ValueError(
                    f"{path}, line {n}: not a {dataset} record ({exc}); for a file of your own prompts leave out "
                    "--dataset"
                ) from None
    else:
        label = task or _stem(path)
        records = _generic_records(path, field, None if task else task_field, id_field)
        seen = set()
        for own_id in (r[3] for r in records if r[3] is not None):
            if own_id in seen:
                raise ValueError(
                    f"{path}: two records have the id {own_id!r} ({id_field!r}); ids must be distinct "
                    "(or pass --id-field none to number the records)"
                )
            seen.add(own_id)
    out = []
    for i, text, *own in records:
        if i < start:
            continue
        if limit is not None and len(out) >= limit:
            break
        name = (own[0] if own else None) or label
        own_id = own[1] if len(own) > 1 else None
        out.append(Prompt(id=f"{name}-{i if own_id is None else own_id}", task=name, text=text, index=i))
    return out


def mixed_prompts(data_dir, per_task: dict[str, int]) -> list[Prompt]:
    """The first ``per_task[name]`` prompts of each named benchmark in the data directory
    ``data_dir`` (None: ``data_directory()``), interleaved."""
    lists = [load_prompts(benchmark_file(name, data_dir), name, limit=n) for name, n in per_task.items()]
    out = []
    for group in zip(*lists, strict=False):
        out.extend(group)
    longest = max(len(x) for x in lists) if lists else 0
    for lst in lists:
        out.extend(lst[min(len(x) for x in lists) : longest])
    return out
