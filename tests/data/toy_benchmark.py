"""A benchmark in one file: the worked example of ``docs/contributing/house.md``, and the test that adding a
benchmark needs nothing else (``test_benchmarks``: ``evaluate --plugin`` this file grades through it).

"toy-sums": JSON Lines of ``{"a": 2, "b": 3}``; the prompt asks for the sum, an answer is right when the last
integer it writes is a + b."""

import re
from typing import ClassVar

from cactus_theory.benchmarks import Benchmark, Grade


class ToySums(Benchmark):
    name: ClassVar[str] = "toy-sums"
    source: ClassVar[str] = "the test's own file"

    def prompt(self, record):
        return f"What is {record['a']} + {record['b']}? End with the number."

    def reference(self, record, where):
        if not all(isinstance(record.get(k), int) for k in ("a", "b")):
            raise ValueError(f"{where}: a toy-sums record needs integers 'a' and 'b'")
        return {"sum": record["a"] + record["b"]}

    def grade(self, reference, completion, *, timeout=None, pattern=None):
        found = re.findall(r"-?\d+", completion)
        answer = int(found[-1]) if found else None
        return Grade(answer == reference["sum"], None if answer is None else str(answer), "last integer")
