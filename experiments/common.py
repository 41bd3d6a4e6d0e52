"""What the experiment scripts share: the model pair they run (Qwen2.5-Coder-0.5B-Instruct drafting for
1.5B-Instruct, Q4_K_M, as ``fetch_models.py`` puts them), the paper's sampling, where their caches and pages go, and
the argument types every script's flags are checked with (``count``, ``number``, ``names``, ``existing``,
``counts``): argparse refuses a bad flag in one line naming it, exit 2, before any model loads or server starts.

Not a script: ``from common import VERIFIER, DRAFT, SETTINGS, count`` in one.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import tempfile

from cactus_theory import SamplingSettings

#: The user cache the scripts keep their models, records and traces in.
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "cactus_theory")
#: Where ``fetch_models.py`` puts the GGUF files.
MODELS = os.path.join(CACHE, "models")
#: The pair: the verifier's and the draft's GGUF file names.
VERIFIER, DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
#: The paper's sampling (temperature 0.6, top-k 20, top-p 0.95; vLLM's chain): ``SamplingSettings()``.
SETTINGS = SamplingSettings()
#: The repository's committed pages.
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")


def pair_paths(models) -> tuple:
    """(verifier, draft) GGUF paths in the directory ``models``."""
    return os.path.join(models, VERIFIER), os.path.join(models, DRAFT)


def count(low=1, high=None):
    """An integer of at least ``low`` (and at most ``high``): an argparse type (a bool-like or fractional value
    refused)."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if value < low or (high is not None and value > high):
            within = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be an integer {within}; got {value}")
        return value

    parse.__name__ = "count"
    return parse


def counts(low=1):
    """Comma-separated integers, each at least ``low`` (``--parallel 1,2,4``): an argparse type."""
    one = count(low)

    def parse(text):
        parts = [p.strip() for p in str(text).split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"must be integers separated by commas; got {text!r}")
        return [one(p) for p in parts]

    parse.__name__ = "counts"
    return parse


def number(low=None, high=None, *, above=None):
    """A finite number, at least ``low`` / above ``above`` / at most ``high`` where given: an argparse type (NaN
    and the infinities refused)."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
        bounds = []
        if low is not None:
            bounds.append(f">= {low:g}")
        if above is not None:
            bounds.append(f"> {above:g}")
        if high is not None:
            bounds.append(f"<= {high:g}")
        bad = (
            not math.isfinite(value)
            or (low is not None and value < low)
            or (above is not None and value <= above)
            or (high is not None and value > high)
        )
        if bad:
            raise argparse.ArgumentTypeError(f"must be a finite number {' and '.join(bounds)}; got {text}".rstrip())
        return value

    parse.__name__ = "number"
    return parse


def names(known, what="names"):
    """Comma-separated names, each one of ``known`` (a collection, or a function giving it): an argparse type."""

    def parse(text):
        allowed = known() if callable(known) else known
        given = [p.strip() for p in str(text).split(",") if p.strip()]
        unknown = [g for g in given if g not in allowed]
        if not given or unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or repr(text)}; the {what}: {', '.join(sorted(allowed))}"
            )
        return given

    parse.__name__ = what
    return parse


def existing(what="a path"):
    """A path that exists (a file or a directory): an argparse type."""

    def parse(text):
        path = os.path.expanduser(str(text))
        if not os.path.exists(path):
            raise argparse.ArgumentTypeError(f"{what} {text!r} does not exist")
        return path

    parse.__name__ = what
    return parse


def server_itself(text):
    """``--server-binary``: llama-server itself, an executable that is not a shell launcher (a shell script that runs
    the server without ``exec`` would leave it running, holding its port, were this script killed with SIGKILL:
    the kernel's parent-death signal reaches the shell alone). A program whose own process is the server (a binary,
    or a script its interpreter runs) is taken. An argparse type."""
    path = os.path.expanduser(str(text))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not an executable file: give llama-server itself")
    with open(path, "rb") as fh:
        first = fh.readline(256)
    shells = (b"sh", b"bash", b"dash", b"zsh", b"ksh")
    if first.startswith(b"#!") and any(word.rsplit(b"/", 1)[-1] in shells for word in first[2:].split()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a shell script: give llama-server itself (a launcher that runs the server without exec "
            "would leave it running, holding its port, were this script killed)"
        )
    return path


@contextlib.contextmanager
def scratch(prefix):
    """A temporary directory for a run's servers' log and work files, removed however the block ends; where it ends
    in an error, the last lines of its ``servers.log`` go to stderr first (the log itself goes with the directory)."""
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        yield work
    except BaseException:
        log = os.path.join(work, "servers.log")
        if os.path.exists(log):
            with open(log, encoding="utf-8", errors="replace") as fh:
                tail = fh.read().splitlines()[-20:]
            print("the servers' log, its last lines:\n" + "\n".join(tail), file=sys.stderr, flush=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def writable_out(parser, out):
    """``--out`` checked before any work (a directory this process can write), or argparse's one-line refusal."""
    from cactus_theory.io import check_output

    try:
        return check_output(out, what="--out")
    except ValueError as exc:
        parser.error(str(exc))


class Parser(argparse.ArgumentParser):
    """The scripts' argument parser: a refusal is one line naming the flag (``SCRIPT: error: argument --x: ...``),
    exit 2, without the usage block; and no flag is taken by an abbreviation."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())} (see --help)\n")
