"""One resumable dump session (``_data._dump_session``): what it skips, what ``limit`` keeps, what it says
on a resume, an interruption and the end, and one summary, whatever produces the rows."""

import numpy as np
import pytest

from cactus_theory._data._dump_session import DumpSession, DumpSummary
from cactus_theory._data._prompts import Prompt
from cactus_theory.traces import Trace

PROMPTS = [Prompt(id=f"p{i}", task="toy", text=f"text {i}", index=i) for i in range(5)]


def _rows(n, k=3, vocab=10):
    values = -np.arange(k, dtype=np.float32)[None, :].repeat(n, 0)
    ids = np.arange(k, dtype=np.int32)[None, :].repeat(n, 0)
    return values, ids, np.zeros(n)


def _session(out, **kw):
    args = {"top_k": 3, "metadata": {"seed": 0}, "progress": False}
    args.update(kw)
    return DumpSession(out, PROMPTS, 10, **args)


def _add(session, prompt, n):
    rows = _rows(n)
    session.add(prompt, np.arange(n) % 10, {"target": rows, "draft": rows}, meta={"prompt_tokens": 2})


def test_a_session_writes_resumes_limits_and_sums_up(tmp_path, capsys):
    with _session(tmp_path / "t", limit=2) as s:
        assert [p.id for p in s.todo] == ["p0", "p1"]
        _add(s, s.todo[0], 3)
        s.refuse(s.todo[1], "misaligned")
    assert s.summary == DumpSummary(1, 3, ["p1"], 1, 3, s.summary.seconds)
    assert "refused p1: misaligned" in capsys.readouterr().err
    with _session(tmp_path / "t") as s:
        assert [p.id for p in s.todo] == ["p1", "p2", "p3", "p4"]  # the refused one is tried again
        for p in s.todo:
            _add(s, p, 4)
    err = capsys.readouterr().err
    assert "resuming" in err and "1 of 5 prompts done, 3 positions in the trace" in err
    assert "this run: 4 prompt(s), 16 positions" in err and "the trace holds 5 prompts, 19 positions" in err
    assert (s.summary.written_prompts, s.summary.trace_positions) == (4, 19) and len(Trace(tmp_path / "t")) == 5
    assert s.summary.positions_per_second == s.summary.tokens_per_second > 0


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_session_keeps_what_completed_says_so_and_stops_its_producers(tmp_path, capsys, stop):
    closed = []
    with pytest.raises(stop), _session(tmp_path / "t", on_stop=[lambda: closed.append(1)]) as s:
        _add(s, s.todo[0], 3)
        raise stop()
    assert closed == [1] and s.summary is None
    assert len(Trace(tmp_path / "t")) == 1  # the completed sequence held in memory was written
    err = capsys.readouterr().err
    said = "stopped after 1 prompt(s) of this run (3 positions); 1 of 5 prompts are in"
    assert (said in err) == (stop is KeyboardInterrupt)  # an error speaks for itself
