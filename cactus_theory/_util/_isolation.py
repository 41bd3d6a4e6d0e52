"""Operating-system isolation of a program the package did not write: fresh user, mount, PID, network, IPC,
UTS and cgroup namespaces, built by util-linux's ``unshare``, ``mount``, ``pivot_root`` and ``setpriv``
(present on every glibc Linux distribution, nothing to install).

What a program sees: a root file system of its own (a read-only tmpfs) holding read-only bind mounts of the
system's libraries and programs (``/usr``, ``/bin``, ``/lib*``, ``/etc/ld.so.cache``), of the Python
installation that runs it (its virtual environment and the interpreter behind it: a program imports what
it could import unisolated), and of four devices (``/dev/null``, ``/dev/zero``, ``/dev/random``,
``/dev/urandom``); a writable ``/sandbox`` (its working directory: a tmpfs of a fixed size, the disk quota,
``noexec``: nothing it writes can be loaded as machine code);
its own ``/proc`` (``subset=pid``: its own processes only, no ``/proc/sys``). The grader, its files, its
environment and every other process of the machine are outside it. No network device but a loopback that is
down. It runs as user 65534 of a fresh user namespace, with no capability (empty bounding set,
``no_new_privs``); where the grader runs as root, that user is the machine's unprivileged ``nobody``, so
the kernel counts its processes against ``RLIMIT_NPROC`` (it never does for root).

Why util-linux and not bubblewrap: util-linux is on every glibc Linux (bubblewrap often is not, and was not
on the machines this package is tested on), and where the grader runs as root (CI runners, containers)
bubblewrap maps the sandbox's user to root, for whom the kernel enforces no process limit; the chain here
drops to ``nobody`` after mounting. The chain, as the grader starts it::

    unshare --mount --pid --net --ipc --uts --cgroup --fork --kill-child [--user --map-root-user] \\
      /bin/sh -c SETUP ...                      # pid 1 of the namespace: mounts, pivot_root, then
        [setpriv --reuid=65534 --regid=65534 --clear-groups]             # root only: drop to nobody
        unshare --user --map-user=65534 --map-group=65534 --keep-caps     # the program's own namespace
        setpriv --bounding-set=-all --inh-caps=-all --ambient-caps=-all --no-new-privs
        python -I -B ...                         # the program's launcher (``_sandbox``)

Killing the outer ``unshare`` kills pid 1 (``--kill-child``), and with it every process of the namespace.
Where the kernel has them, the launcher adds Landlock (file system: read everywhere it can see, write in
``/sandbox``; signals and abstract sockets scoped) and a seccomp filter (no ptrace, mount, namespaces,
keyrings, BPF, io_uring, sockets but Unix ones), through the ``py-landlock`` and ``pyseccomp`` bindings when
they are installed in the environment (the ``sandbox`` extra); ``isolation_status`` says which layers a run
gets, and each result which it had.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

__all__ = [
    "UNISOLATED_ENV",
    "IsolationStatus",
    "IsolationUnavailable",
    "isolated_command",
    "isolation_status",
]

#: Set to 1 to run model-written code without OS isolation (the in-interpreter guard alone), knowingly.
UNISOLATED_ENV = "CACTUS_UNISOLATED_CODE"
#: The program's user inside its namespace (and, where the grader is root, on the machine: nobody).
SANDBOX_UID = 65534
#: Where the program's directory is, inside its root.
HOME = "/sandbox"
#: The exit status of a setup that failed (the program never ran).
SETUP_FAILED = 125

_TOOLS = ("unshare", "setpriv", "mount", "umount", "pivot_root")
#: Where the tools are looked for (the grader's PATH is not trusted for them), inside and outside.
TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")

# pid 1 of the namespace: $1 the new root's mount point (an empty directory of the grader's), $2 the
# program directory's size, $3 its owner, then the read-only sources up to "--", then the command. Every
# failure exits SETUP_FAILED with one line on stderr, so it is never taken for the program's own failure.
SETUP = r"""
fail() { echo "cactus-sandbox: setup: $*" >&2; exit 125; }
PATH=/usr/sbin:/usr/bin:/sbin:/bin; export PATH
root=$1; size=$2; owner=$3; shift 3
mount -t tmpfs -o mode=0755,size=1m,nosuid,nodev cactus-root "$root" || fail "tmpfs root"
while [ "$1" != "--" ]; do
  kind=$1; src=$2; dst=$root$3; shift 3
  mkdir -p "$(dirname "$dst")" || fail "mkdir $dst"
  case $kind in
    link) ln -s "$(readlink "$src")" "$dst" || fail "link $src" ;;
    dir) { mkdir -p "$dst" && mount --bind -o ro,nosuid,nodev "$src" "$dst"; } || fail "bind $src" ;;
    dev) { : > "$dst" && mount --bind -o ro,nosuid "$src" "$dst"; } || fail "bind $src" ;;
    *) { : > "$dst" && mount --bind -o ro,nosuid,nodev "$src" "$dst"; } || fail "bind $src" ;;
  esac
done
shift
mkdir -p "$root/proc" "$root/sandbox" || fail "mkdir"
mount -t proc -o nosuid,nodev,noexec,subset=pid proc "$root/proc" 2>/dev/null \
  || mount -t proc -o nosuid,nodev,noexec proc "$root/proc" || fail "proc"
home="size=$size,mode=0700,uid=$owner,gid=$owner,nosuid,nodev,noexec"
mount -t tmpfs -o "$home" cactus-home "$root/sandbox" || fail "home"
mount -o remount,bind,ro,nosuid,nodev "$root" || fail "read-only root"
{ cd "$root" && pivot_root . . && umount -l . && cd /sandbox; } || fail "pivot_root"
"$@"
"""


#: The environment the chain starts with (nothing of the grader's).
_ENV = {"PATH": TOOL_PATH, "LANG": "C.UTF-8"}


class IsolationUnavailable(RuntimeError):
    """Model-written code cannot be isolated by the operating system here (the message says why and what
    to do)."""


@dataclass(frozen=True)
class IsolationStatus:
    """Whether programs can run isolated here: ``available``, ``reason`` (why not), ``as_root`` (the grader
    is root: the program runs as nobody), ``layers`` (what the launcher adds where the kernel and the
    bindings allow: "landlock", "seccomp")."""

    available: bool
    reason: str
    as_root: bool
    layers: tuple


def _python() -> str:
    """The interpreter's real file (a virtual environment's ``python`` is a link to it)."""
    return os.path.realpath(sys.executable)


def _covered(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mounts() -> list:
    """(source, destination) pairs the program's root holds read-only, in the order they are mounted."""
    pairs = [(p, p) for p in _SYSTEM if os.path.lexists(p)]
    real_roots = [os.path.realpath(p) for p, _ in pairs]
    python = _python()
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    for extra in (*(os.path.realpath(p) for p in prefixes), os.path.dirname(python)):
        if os.path.isdir(extra) and not _covered(extra, real_roots):
            pairs.append((extra, extra))
            real_roots.append(extra)
    pairs += [(d, d) for d in _DEVICES if os.path.exists(d)]
    return pairs


def isolated_command(command, root_mount_point: str, *, home_bytes: int) -> list:
    """The argument vector that runs ``command`` (a list: the program's interpreter and its arguments, as
    seen inside) isolated as the module docstring describes; ``root_mount_point``: an empty directory the
    grader made (the new root is mounted on it, in the program's mount namespace alone); ``home_bytes``: the
    size of the program's directory."""
    as_root = os.geteuid() == 0
    unshare = shutil.which("unshare", path=TOOL_PATH) or "unshare"
    outer = [unshare, "--mount", "--pid", "--net", "--ipc", "--uts", "--cgroup", "--fork", "--kill-child"]
    if not as_root:
        outer += ["--user", "--map-root-user"]
    sources = []
    for source, destination in _mounts():
        # a symbolic link (merged /usr: /bin -> usr/bin) is made again as the same link
        if os.path.islink(source):
            kind = "link"
        elif os.path.isdir(source):
            kind = "dir"
        else:
            kind = "dev" if source in _DEVICES else "file"
        sources += [kind, source, destination]
    drop = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"] if as_root else []
    inner = [
        *drop,
        "unshare",
        "--user",
        f"--map-user={SANDBOX_UID}",
        f"--map-group={SANDBOX_UID}",
        "--keep-caps",
        "--",
        "setpriv",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--no-new-privs",
        "--",
        *command,
    ]
    owner = str(SANDBOX_UID if as_root else 0)
    setup = ["/bin/sh", "-c", SETUP, "cactus-sandbox", root_mount_point, str(int(home_bytes)), owner]
    return [*outer, "--", *setup, *sources, "--", *inner]


@functools.lru_cache(maxsize=1)
def isolation_status() -> IsolationStatus:
    """Whether isolation works here, tried for real once per process (a program that prints its user and
    the layers it got, run through ``isolated_command``)."""
    import tempfile

    as_root = os.geteuid() == 0
    if not sys.platform.startswith("linux"):
        return IsolationStatus(False, f"it needs Linux namespaces (this is {sys.platform})", as_root, ())
    missing = [t for t in _TOOLS if shutil.which(t, path=TOOL_PATH) is None]
    if missing:
        return IsolationStatus(
            False, f"util-linux's {', '.join(missing)} not found on PATH (install util-linux)", as_root, ()
        )
    probe = (
        "import os\n"
        "from importlib.util import find_spec\n"
        "print(os.getuid(), os.getcwd(), *(m for m in ('py_landlock', 'pyseccomp') if find_spec(m)))\n"
    )
    mount_point = tempfile.mkdtemp(prefix="cactus-root-")
    try:
        command = isolated_command([sys.executable, "-I", "-B", "-c", probe], mount_point, home_bytes=1 << 20)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, env=_ENV, cwd="/"
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return IsolationStatus(False, f"the isolated probe did not run ({exc})", as_root, ())
    finally:
        os.rmdir(mount_point)
    words = done.stdout.split()
    if done.returncode != 0 or words[:2] != [str(SANDBOX_UID), HOME]:
        detail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        hint = "" if as_root else " (unprivileged user namespaces may be off: sysctl kernel.unprivileged_userns_clone)"
        return IsolationStatus(False, f"unshare could not isolate a program: {detail}{hint}", as_root, ())
    layers = tuple(
        name
        for name, module in (("landlock", "py_landlock"), ("seccomp", "pyseccomp"))
        if module in words[2:] and _kernel_has(name)
    )
    return IsolationStatus(True, "", as_root, layers)


def _kernel_has(layer: str) -> bool:
    """Whether the kernel offers ``layer`` ("landlock": its ABI answers; "seccomp": filter mode)."""
    if layer == "seccomp":
        try:
            with open("/proc/self/status", encoding="ascii") as fh:
                return any(line.startswith("Seccomp:") for line in fh)
        except OSError:
            return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(444, None, 0, 1)) >= 1  # landlock_create_ruleset(NULL, 0, VERSION)
    except (OSError, AttributeError):
        return False
