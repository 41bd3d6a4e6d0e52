"""The resumable run around a records file: an interruption (Ctrl-C, SIGTERM, SIGHUP) closes the run's bar,
says in one line what is kept and how to resume, and goes on; a run that ends leaves nothing on stderr."""

import os
import signal

import pytest

from cactus_theory._util._files import Terminated
from cactus_theory._util._records import resumable_run


class Bar:
    closed = 0

    def close(self):
        self.closed += 1


def test_ctrl_c_closes_the_bar_and_says_what_is_kept_and_how_to_resume(capsys):
    kept, bar = [], Bar()
    with pytest.raises(KeyboardInterrupt), resumable_run("records.jsonl", lambda: f"{len(kept)} record(s) kept") as run:
        run.bar = bar
        kept += [1, 2, 3]
        raise KeyboardInterrupt
    err = capsys.readouterr().err
    assert err == "stopped: 3 record(s) kept in records.jsonl: rerun the same command to resume\n"
    assert bar.closed == 1


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_termination_signal_becomes_an_exception_with_the_same_line(capsys, name):
    before = signal.getsignal(getattr(signal, name))
    with pytest.raises(Terminated) as caught, resumable_run(None, lambda: "nothing kept"):
        os.kill(os.getpid(), getattr(signal, name))
        raise AssertionError("the signal did not interrupt the block")
    assert caught.value.code == 128 + getattr(signal, name)
    assert capsys.readouterr().err == "stopped: nothing kept\n"  # no records file: nothing to resume from
    assert signal.getsignal(getattr(signal, name)) is before  # the previous handler is back


def test_a_run_that_ends_or_fails_otherwise_prints_nothing(capsys):
    with resumable_run("r.jsonl", lambda: "x") as run:
        run.bar = Bar()
    with pytest.raises(ValueError), resumable_run("r.jsonl", lambda: "x"):
        raise ValueError("not an interruption")
    assert capsys.readouterr().err == ""
