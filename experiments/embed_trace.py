"""Copy a dumped trace into the package as the embedded default (cactus_theory/data/default_trace).

Usage:
    python experiments/embed_trace.py [--trace ~/.cache/cactus_theory/traces/qwen2.5-coder-0.5b-for-1.5b]

Checks the trace (every shard's checksum), refuses anything above 10 MB, and replaces the
embedded copy atomically (a temporary directory renamed into place). The trace carries no
prompt text or prompt token ids: each sequence refers to its prompt by dataset, index and the
sha256 of the text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

from cactus_theory._trace import Trace

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "..", "cactus_theory", "data", "default_trace")
LIMIT = 10 * 2**20


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trace", default=os.path.expanduser("~/.cache/cactus_theory/traces/qwen2.5-coder-0.5b-for-1.5b")
    )
    args = parser.parse_args(argv)
    trace = Trace(args.trace, verify=True)
    files = ["manifest.json"] + [s["file"] for s in trace.manifest["shards"]]
    size = sum(os.path.getsize(os.path.join(args.trace, f)) for f in files)
    if size > LIMIT:
        raise SystemExit(f"trace is {size / 2**20:.1f} MB, above the 10 MB limit for the embedded default")
    for seq in trace.manifest["sequences"]:
        if "prompt_ids" in seq or "text" in seq.get("meta", {}):
            raise SystemExit("the trace carries prompt text or ids: it may not be embedded")
    parent = os.path.dirname(os.path.abspath(TARGET))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".default_trace.")
    for f in files:
        shutil.copy2(os.path.join(args.trace, f), os.path.join(tmp, f))
    Trace(tmp, verify=True)
    old = TARGET + ".old"
    if os.path.exists(TARGET):
        os.replace(TARGET, old)
    os.replace(tmp, TARGET)
    shutil.rmtree(old, ignore_errors=True)
    print(json.dumps({"sequences": len(trace), "positions": trace.n_positions, "bytes": size, "path": TARGET}))


if __name__ == "__main__":
    main()
