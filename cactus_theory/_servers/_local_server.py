"""A llama-server this process starts on 127.0.0.1 for the length of a block (``local_llama_server``): a free
port, its readiness awaited (``/health``), and its stop however the block ends (``_util._processes
.managed_process``: its own process group, stopped on a normal end, an error, Ctrl-C, SIGTERM or SIGHUP, and
killed by the kernel if this process dies without a clean-up). What the experiments and the tests start."""

from __future__ import annotations

import contextlib
import socket

from .._util._processes import managed_process

__all__ = ["free_port", "local_llama_server"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_llama_server(binary, model, *args, log, port=None, start_timeout=600.0, quiet=False):
    """llama-server (``binary``) serving the GGUF file ``model`` with ``args`` on 127.0.0.1 for the block; yields
    its URL. Its output is appended to ``log``. A port another process takes before the server binds it is
    tried again with another (five times)."""
    import httpx

    for _attempt in range(5):
        chosen = port or free_port()
        url = f"http://127.0.0.1:{chosen}"

        def ready(process, url=url):
            try:
                return httpx.get(url + "/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", chosen, "--no-webui", *args]
        started = False
        try:
            with managed_process(
                argv,
                log=log,
                what=f"llama-server on port {chosen}",
                ready=ready,
                start_timeout=start_timeout,
                quiet=quiet,
            ):
                started = True
                yield url
                return
        except RuntimeError:
            if started or port is not None:
                raise
            with open(log, "rb") as fh:
                text = fh.read()[-4000:].decode(errors="replace").lower()
            if "bind" not in text and "address already in use" not in text:
                raise
    raise RuntimeError("llama-server could not bind a free port five times")
