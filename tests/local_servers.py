"""Servers the servers wing's tests start on 127.0.0.1 (a free port each, never outliving their test): llama.cpp's
own ``llama-server`` (``LlamaServer``, ``llama_server``), small HTTP servers answering as a handler says
(``FakeServer``: stand-ins for vLLM and SGLang, which cannot run here, and servers that misbehave on purpose),
and one that sends its body a byte at a time (``Dribbler``). The fixtures that start them are in
``conftest.py``."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Dribbler", "FakeServer", "LlamaServer", "free_port", "llama_server"]


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


class Dribbler:
    """A server on 127.0.0.1 that answers every request with its headers, then one byte of body at a time,
    each after ``pause`` seconds (``stop`` ends it); with ``headers=True`` its headers too, a byte at a time."""

    def __init__(self, pause=0.2, length=10_000, headers=False):
        self.headers, self.accepted = headers, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.pause, self.length, self.done = pause, length, threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self):
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.recv(65536)
                head = (
                    f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {self.length}"
                    "\r\n\r\n".encode()
                )
                if not self.headers:
                    conn.sendall(head)
                    head = b""
                for byte in [head[i : i + 1] for i in range(len(head))] + [b" "] * self.length:
                    if self.done.wait(self.pause):
                        return
                    try:
                        conn.sendall(byte)
                    except OSError:
                        break

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.sock.close()
