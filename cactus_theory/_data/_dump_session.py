"""One resumable dump into a trace directory, whatever produces the rows (models loaded here, or
running servers): the writer and its lock, the prompts still to do and ``limit``, progress, what is
said on a resume, an interruption and the end, and one summary (``DumpSummary``)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from .._util._files import Terminated, termination_as_exception
from .._util._progress import progress_bar
from .._util._results import Result
from ._trace_writer import TraceWriter

__all__ = ["DumpSession", "DumpSummary"]


@dataclass
class DumpSummary(Result):
    """What a dump did: prompts and positions written by this run, prompts refused (their ids), the
    trace's totals, and the seconds this run took; a result as every other (one record; ``table``)."""

    written_prompts: int
    written_positions: int
    refused: list = field(default_factory=list)
    trace_prompts: int = 0
    trace_positions: int = 0
    seconds: float = 0.0

    @property
    def positions_per_second(self) -> float:
        """Positions written per second of this run (both models' rows of a position count once)."""
        return self.written_positions / self.seconds if self.seconds > 0 else float("nan")

    #: The verifier's generation speed as the server dump reported it (the same number).
    tokens_per_second = positions_per_second

    name = "dump"

    def records(self) -> list:
        return [
            {
                "written_prompts": self.written_prompts,
                "written_positions": self.written_positions,
                "refused": len(self.refused),
                "trace_prompts": self.trace_prompts,
                "trace_positions": self.trace_positions,
                "seconds": self.seconds,
                "positions_per_second": self.positions_per_second,
            }
        ]

    def table(self) -> str:
        return (
            f"{self.written_prompts} prompt(s), {self.written_positions} position(s) written in {self.seconds:.1f} s "
            f"({self.positions_per_second:.1f} positions/s), {len(self.refused)} refused; the trace holds "
            f"{self.trace_prompts} prompt(s), {self.trace_positions} position(s)"
        )


def _note(message):  # what a user must know, progress bars or not: resumed, stopped, done
    print(message, file=sys.stderr, flush=True)


class DumpSession:
    """A dump of ``prompts`` into the trace directory ``out`` (resumed if it exists), used as a
    context manager around the loop that produces the rows::

        with DumpSession(out, prompts, vocab, top_k=K, metadata=meta, progress=p) as session:
            for prompt in session.todo:
                ...
                session.add(prompt, tokens, compressed, meta=...)
        summary = session.summary

    ``todo``: the prompts the trace does not hold yet, in order, at most ``limit``. ``add`` appends a
    completed sequence (compressed rows: {"target"/"draft": (top-K logits, ids, lse)}), ``refuse``
    counts one that cannot be stored. The directory is locked for the session's lifetime; on
    Ctrl-C, SIGTERM or an error the completed sequences held in memory are written before it stops
    (``TraceWriter``), the callables in ``on_stop`` run (close clients), and a note says what the
    trace holds and how to resume. ``what`` names the dump in the progress bar."""

    def __init__(
        self,
        out,
        prompts,
        vocab,
        *,
        top_k,
        metadata,
        limit=None,
        shard_positions=2048,
        store_full=False,
        progress=None,
        what="dump",
        on_stop=(),
    ):
        self.out, self.prompts, self.vocab = str(out), list(prompts), vocab
        self._writer_args = {
            "top_k": top_k,
            "metadata": metadata,
            "shard_positions": shard_positions,
            "store_full": store_full,
        }
        self.limit, self.progress, self.what, self.on_stop = limit, progress, what, list(on_stop)
        self.writer = None
        self.todo = []
        self.done_before = 0
        self.written_prompts = self.written_positions = 0
        self.refused = []
        self.summary = None
        self._start = None
        self._signals = None
        self._bar = None

    def __enter__(self):
        self._start = time.perf_counter()
        self._signals = termination_as_exception()
        self._signals.__enter__()
        try:
            self.writer = TraceWriter(self.out, self.vocab, **self._writer_args)
        except BaseException:
            self._signals.__exit__(None, None, None)
            raise
        done = self.writer.done_ids
        self.done_before = sum(1 for p in self.prompts if p.id in done)
        if self.done_before:
            _note(
                f"resuming {self.out}: {self.done_before} of {len(self.prompts)} prompts done, "
                f"{self.writer.positions_held:,} positions in the trace"
            )
        self.todo = [p for p in self.prompts if p.id not in done][: self.limit]
        self._bar = progress_bar(total=len(self.todo), desc=self.what, unit="prompt", enabled=self.progress)
        return self

    @property
    def metadata(self) -> dict:
        """The trace's metadata (a resumed trace's own, as first written)."""
        return self.writer.metadata

    def add(self, prompt, tokens, compressed, full=None, meta=None):
        """Append prompt ``prompt``'s completed sequence (``TraceWriter.add_compressed``)."""
        self.writer.add_compressed(prompt.id, prompt.task, tokens, compressed, full, meta)
        self.written_prompts += 1
        self.written_positions += len(tokens)
        self._advance()

    def refuse(self, prompt, reason):
        """Count prompt ``prompt`` as refused (not stored), saying why."""
        self.refused.append(prompt.id)
        _note(f"refused {prompt.id}: {reason}")
        self._advance()

    def _advance(self):
        self._bar.update(1)
        seconds = max(time.perf_counter() - self._start, 1e-9)
        extra = {"refused": len(self.refused)} if self.refused else {}
        self._bar.set_postfix(
            positions=self.written_positions, pos_s=f"{self.written_positions / seconds:.1f}", **extra
        )

    def __exit__(self, exc_type, exc, tb):
        interrupted = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, Terminated))
        try:
            if self._bar is not None:
                self._bar.close()
            if exc_type is not None:
                for stop in self.on_stop:  # in-flight work ends now; what completed is written below
                    stop()
            self.writer.close()
        finally:
            self._signals.__exit__(exc_type, exc, tb)
        held = len(self.writer.done_ids), self.writer.positions_held
        if interrupted:
            _note(
                f"stopped after {self.written_prompts} prompt(s) of this run ({self.written_positions:,} positions); "
                f"{self.done_before + self.written_prompts} of {len(self.prompts)} prompts are in {self.out} "
                f"({held[1]:,} positions): rerun the same command to resume"
            )
        if exc_type is not None:
            return False
        self.summary = DumpSummary(
            self.written_prompts,
            self.written_positions,
            list(self.refused),
            held[0],
            held[1],
            time.perf_counter() - self._start,
        )
        s = self.summary
        _note(
            f"this run: {s.written_prompts} prompt(s), {s.written_positions:,} positions "
            f"({s.positions_per_second:.1f} positions/s)"
            + (f", {len(s.refused)} refused ({', '.join(s.refused[:5])})" if s.refused else "")
            + f"; the trace holds {s.trace_prompts} prompts, {s.trace_positions:,} positions"
        )
        return False
