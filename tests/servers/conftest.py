"""Servers for the tests of the servers wing: llama.cpp's own ``llama-server`` started on 127.0.0.1 with the
tiny GGUF test models (a free port, never outliving its test module), and small local HTTP servers that answer
as vLLM and SGLang do (their servers cannot run here) or misbehave on purpose.

The llama-server binary: ``$CACTUS_LLAMA_SERVER`` (``scripts/check.sh`` builds it with
``scripts/build_llama_server.py`` and exports it), else the build script's cache. Without one the tests
that need it are skipped, except in CI (CI=true), where they fail."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def llama_server_binary() -> str | None:
    """The llama-server to test with, or None."""
    found = os.environ.get("CACTUS_LLAMA_SERVER")
    if found:
        return found if os.access(found, os.X_OK) else None
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates = sorted(glob.glob(os.path.join(home, "cactus_theory", "llama-server", "*", "llama-server")))
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def server_binary():
    binary = llama_server_binary()
    if binary is None:
        message = "needs llama-server: python scripts/build_llama_server.py (scripts/check.sh runs it)"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process on 127.0.0.1 (``url``); ``stop`` kills it and waits for it."""

    def __init__(self, binary, model, *args, log_dir, port=None):
        self.binary, self.model, self.args, self.log_dir = binary, str(model), list(args), pathlib.Path(log_dir)
        self.port = port
        self.process = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        """Start it and wait until /health answers 200 (the event: the server's own readiness; the process
        exiting first fails at once with its log)."""
        import httpx

        for _attempt in range(5):  # a port taken between choosing and binding: choose another
            port = self.port or free_port()
            self.log = self.log_dir / f"llama-server-{port}.log"
            command = [
                self.binary,
                "-m",
                self.model,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-webui",
                "-t",
                "1",
                "-tb",
                "1",
                "--no-warmup",
                *self.args,
            ]
            with open(self.log, "wb") as log:
                self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.port = port
            while self.process.poll() is None:
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            text = self.log.read_text(errors="replace")
            if "bind" in text.lower() or "address already in use" in text.lower():
                self.port = None
                continue
            raise RuntimeError(f"llama-server exited with {self.process.returncode}:\n{text[-3000:]}")
        raise RuntimeError("llama-server could not bind a free port five times")

    def kill(self):
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)  # then SIGKILL: a clean-up, not a check
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def llama_server(binary, model, *args, log_dir, port=None):
    server = LlamaServer(binary, model, *args, log_dir=log_dir, port=port)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_ggufs(tmp_path_factory):
    """(verifier, draft) GGUF files of two tiny random Qwen2 models sharing a 64-token BPE vocabulary."""
    pytest.importorskip("gguf") if not _in_ci() else None
    from tiny_models import tiny_model, write_tiny_gguf

    d = tmp_path_factory.mktemp("ggufs")
    return write_tiny_gguf(tiny_model(seed=0), d / "verifier.gguf"), write_tiny_gguf(
        tiny_model(seed=1, layers=1), d / "draft.gguf"
    )


@pytest.fixture(scope="module")
def llama_pair(server_binary, tiny_ggufs, tmp_path_factory):
    """Two llama-servers (verifier, draft), one slot each, for the module's tests."""
    logs = tmp_path_factory.mktemp("server-logs")
    with (
        llama_server(server_binary, tiny_ggufs[0], "-np", "1", "-c", "256", log_dir=logs) as verifier,
        llama_server(server_binary, tiny_ggufs[1], "-np", "1", "-c", "256", log_dir=logs) as draft,
    ):
        yield verifier, draft


class FakeServer:
    """A local HTTP server on 127.0.0.1 whose answers come from ``handler(method, path, body, headers)`` ->
    (status, JSON-able or str body[, headers]); ``requests`` lists what it received."""

    def __init__(self, handler):
        self.handler = handler
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                outer.requests.append((self.command, self.path, body, dict(self.headers)))
                result = outer.handler(self.command, self.path, body, dict(self.headers))
                status, payload = result[0], result[1]
                headers = result[2] if len(result) > 2 else {}
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
