"""Fetch the multiple-choice benchmark the exact quality referee runs on, into the data directory, checked.

ARC-Challenge's test set (AI2 Reasoning Challenge, Clark et al. 2018, arXiv 1803.05457; CC BY-SA 4.0): 1,172
grade-school science questions of four choices, as MosaicML's llm-foundry keeps it in its evaluation
gauntlet (`{"query": "Question: ...", "choices": [...], "gold": index}`), at one commit:

    https://github.com/mosaicml/llm-foundry, commit 8c8dd48f72168c5d51e2f7b151595892a8fba43d,
    scripts/eval/local_data/world_knowledge/arc_challenge.jsonl (added in ffcc56816, "Model gauntlet")

Usage:
    python experiments/fetch_benchmark.py [--data DIR] [--from FILE]

The file lands in DIR/arc_challenge/test.jsonl (DIR: --data, else $CACTUS_THEORY_DATA, else the user cache's
data directory), written to a temporary name and renamed once its sha256 is the pinned one (a mismatch is
refused and nothing is written). --from takes a copy you already have (a machine without the network) and
checks it the same way. Never run by the tests (they use a small file of their own) nor by CI. Prints the path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.request

COMMIT = "8c8dd48f72168c5d51e2f7b151595892a8fba43d"
URL = (
    f"https://raw.githubusercontent.com/mosaicml/llm-foundry/{COMMIT}/"
    "scripts/eval/local_data/world_knowledge/arc_challenge.jsonl"
)
#: sha256 of the file at that commit (365,606 bytes, 1,172 lines).
SHA256 = "1ae3aeedf1951d881cbd5c2e3a31e78a1993d251479afbe4cb413b6707244636"
RELATIVE = os.path.join("arc_challenge", "test.jsonl")


def fetch(data, source=None) -> str:
    """The checked file's path in ``data``: taken from ``source`` (a local copy) or downloaded."""
    target = os.path.join(data, RELATIVE)
    if os.path.isfile(target) and _sha256(open(target, "rb").read()) == SHA256:
        return target
    if source is not None:
        with open(source, "rb") as fh:
            body = fh.read()
    else:
        with urllib.request.urlopen(URL, timeout=120) as answer:
            body = answer.read()
    digest = _sha256(body)
    if digest != SHA256:
        raise SystemExit(f"{source or URL}: sha256 {digest}, not the pinned {SHA256}: refused, nothing written")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".cactus_theory-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    with open(os.path.join(os.path.dirname(target), "PROVENANCE.txt"), "w") as fh:
        fh.write(f"{URL}\nsha256 {SHA256}\nAI2 ARC (Clark et al. 2018), CC BY-SA 4.0; via mosaicml/llm-foundry\n")
    return target


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="data directory (default: $CACTUS_THEORY_DATA, else the cache)")
    parser.add_argument("--from", dest="source", default=None, help="a copy of the file you already have")
    args = parser.parse_args(argv)
    from cactus_theory import data_directory

    print(fetch(data_directory(args.data), args.source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
