"""Fetch the multiple-choice benchmarks the exact quality referee runs on, into the data directory, checked.

The four sets of one provenance: MosaicML's llm-foundry keeps them in its evaluation gauntlet
(`{"query": ..., "choices": [...], "gold": index}`), and they are taken at one commit,

    https://github.com/mosaicml/llm-foundry, commit 8c8dd48f72168c5d51e2f7b151595892a8fba43d

| benchmark | file at that commit | problems | licence |
|---|---|---|---|
| arc_challenge | scripts/eval/local_data/world_knowledge/arc_challenge.jsonl | 1,172 | AI2 ARC, CC BY-SA 4.0 |
| arc_easy | scripts/eval/local_data/world_knowledge/arc_easy.jsonl | 2,376 | AI2 ARC, CC BY-SA 4.0 |
| commonsense_qa | scripts/eval/local_data/commonsense_reasoning/commonsense_qa.jsonl | 1,221 | CommonsenseQA, MIT |
| openbook_qa | scripts/eval/local_data/commonsense_reasoning/openbook_qa.jsonl | 500 | OpenBookQA, Apache 2.0 |

5,269 problems in all. (The gauntlet's MMLU is a Git LFS object, not in the tree; it is not fetched.)

Usage:
    python experiments/fetch_benchmark.py [--benchmark NAME ...] [--data DIR] [--from FILE | --from-dir DIR]

Each file lands in DIR/<benchmark>/test.jsonl (DIR: --data, else $CACTUS_THEORY_DATA, else the user cache's data
directory), written to a temporary name and renamed once its sha256 is the pinned one (a mismatch is refused and
nothing is written), with a PROVENANCE.txt beside it. --from takes a copy you already have of one benchmark's file
(a machine without the network), --from-dir a directory holding them (as <benchmark>.jsonl, or llm-foundry's own
tree), each checked the same way. Never run by the tests (they use small files of their own) nor by CI. Prints the
paths.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.request

COMMIT = "8c8dd48f72168c5d51e2f7b151595892a8fba43d"
#: {benchmark: (its path in llm-foundry's tree, sha256 of the file at COMMIT, licence)}.
FILES = {
    "arc_challenge": (
        "scripts/eval/local_data/world_knowledge/arc_challenge.jsonl",
        "1ae3aeedf1951d881cbd5c2e3a31e78a1993d251479afbe4cb413b6707244636",
        "AI2 ARC (Clark et al. 2018), CC BY-SA 4.0",
    ),
    "arc_easy": (
        "scripts/eval/local_data/world_knowledge/arc_easy.jsonl",
        "d2d12e59543acf9a5ef6079634a72b30215e36c2fd4236fff3bc855d287b87f5",
        "AI2 ARC (Clark et al. 2018), CC BY-SA 4.0",
    ),
    "commonsense_qa": (
        "scripts/eval/local_data/commonsense_reasoning/commonsense_qa.jsonl",
        "2771f63f8127c0725b1f6b0ef2cd2ef6469168ae5875fc8d276b25b4f32c8c1a",
        "CommonsenseQA (Talmor et al. 2019), MIT",
    ),
    "openbook_qa": (
        "scripts/eval/local_data/commonsense_reasoning/openbook_qa.jsonl",
        "adb2e5c7f8db810ddad4d6b2bf53dcc86dcc545499f7aafcaf42a8e179476c09",
        "OpenBookQA (Mihaylov et al. 2018), Apache 2.0",
    ),
}


def url(benchmark: str) -> str:
    return f"https://raw.githubusercontent.com/mosaicml/llm-foundry/{COMMIT}/{FILES[benchmark][0]}"


def fetch(data, source=None, benchmark="arc_challenge") -> str:
    """The checked file's path in ``data``: taken from ``source`` (a local copy) or downloaded."""
    _, pinned, licence = FILES[benchmark]
    target = os.path.join(data, benchmark, "test.jsonl")
    if os.path.isfile(target) and _sha256(open(target, "rb").read()) == pinned:
        return target
    if source is not None:
        with open(source, "rb") as fh:
            body = fh.read()
    else:
        with urllib.request.urlopen(url(benchmark), timeout=120) as answer:
            body = answer.read()
    digest = _sha256(body)
    if digest != pinned:
        raise SystemExit(
            f"{source or url(benchmark)}: sha256 {digest}, not the pinned {pinned} of {benchmark}: refused, "
            "nothing written"
        )
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
        fh.write(f"{url(benchmark)}\nsha256 {pinned}\n{licence}; via mosaicml/llm-foundry's evaluation gauntlet\n")
    return target


def _in_directory(directory, benchmark):
    """The copy of ``benchmark``'s file in ``directory``: <benchmark>.jsonl, or llm-foundry's own path."""
    for candidate in (os.path.join(directory, f"{benchmark}.jsonl"), os.path.join(directory, FILES[benchmark][0])):
        if os.path.isfile(candidate):
            return candidate
    raise SystemExit(f"--from-dir {directory}: no {benchmark}.jsonl nor {FILES[benchmark][0]} there")


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", action="append", choices=sorted(FILES), help="one to fetch (default: all)")
    parser.add_argument("--data", default=None, help="data directory (default: $CACTUS_THEORY_DATA, else the cache)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--from", dest="source", default=None, help="a copy of one benchmark's file you already have")
    source.add_argument("--from-dir", default=None, help="a directory holding copies (<benchmark>.jsonl)")
    args = parser.parse_args(argv)
    benchmarks = args.benchmark or sorted(FILES)
    if args.source is not None and len(benchmarks) != 1:
        parser.error("--from is one benchmark's file: name it with --benchmark")
    from cactus_theory.traces import data_directory

    data = data_directory(args.data)
    for name in benchmarks:
        source = _in_directory(args.from_dir, name) if args.from_dir else args.source
        print(fetch(data, source, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
