"""Prompt loaders for the benchmark files in ``shared/data`` (GSM8K, HumanEval, MBPP, MT-Bench,
Spec-Bench). A prompt keeps a reference to its source (dataset, index, sha256 of the text), so a
trace can point at it without carrying the text or its token ids."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass

__all__ = ["DATASETS", "Prompt", "load_prompts", "mixed_prompts"]

DATASETS = ("gsm8k", "humaneval", "mbpp", "mt_bench", "spec_bench")

_FILES = {
    "gsm8k": "gsm8k/test.jsonl",
    "humaneval": "humaneval/HumanEval.jsonl.gz",
    "mbpp": "mbpp/mbpp.jsonl",
    "mt_bench": "mt_bench/question.jsonl",
    "spec_bench": "spec_bench/question.jsonl",
}


@dataclass(frozen=True)
class Prompt:
    """A user message for the chat template, with where it came from."""

    id: str
    task: str
    text: str
    index: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def source(self) -> dict:
        return {"dataset": self.task, "index": self.index, "sha256": self.sha256}


def _infer(path: str) -> str:
    low = path.lower()
    for name in DATASETS:
        if name.replace("_", "") in low.replace("_", "").replace("-", ""):
            return name
    raise ValueError(f"cannot tell the dataset of {path!r}: pass dataset= one of {DATASETS}")


def _records(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _text(dataset: str, rec: dict) -> str:
    if dataset == "gsm8k":
        return f"{rec['question']}\nSolve the problem step by step and give the final answer after '####'."
    if dataset == "humaneval":
        return (
            "Complete the following Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{rec['prompt']}```"
        )
    if dataset == "mbpp":
        tests = "\n".join(rec.get("test_list", [])[:1])
        return f"{rec['text']}\nYour code should pass this test:\n{tests}\nReply with Python code only."
    return rec["turns"][0]  # mt_bench, spec_bench: the first turn


def load_prompts(path, dataset: str | None = None, limit: int | None = None, start: int = 0) -> list[Prompt]:
    """Prompts from one benchmark file (dataset inferred from the path unless given)."""
    path = str(path)
    if not os.path.exists(path):
        raise ValueError(f"prompt file {path!r} does not exist")
    dataset = dataset or _infer(path)
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}; got {dataset!r}")
    out = []
    for i, rec in enumerate(_records(path)):
        if i < start:
            continue
        if limit is not None and len(out) >= limit:
            break
        out.append(Prompt(id=f"{dataset}-{i}", task=dataset, text=_text(dataset, rec), index=i))
    return out


def mixed_prompts(data_dir, per_task: dict[str, int]) -> list[Prompt]:
    """The first ``per_task[name]`` prompts of each named dataset under ``data_dir``, interleaved."""
    lists = [load_prompts(os.path.join(str(data_dir), _FILES[name]), name, limit=n) for name, n in per_task.items()]
    out = []
    for group in zip(*lists, strict=False):
        out.extend(group)
    longest = max(len(x) for x in lists) if lists else 0
    for lst in lists:
        out.extend(lst[min(len(x) for x in lists) : longest])
    return out
