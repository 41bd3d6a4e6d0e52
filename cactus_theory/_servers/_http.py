"""The transport to an inference server: one small layer over httpx, its time-outs and retries explicit.

``ServerClient(url, api_key_env=..., timeout=..., retries=...)`` sends JSON requests to one server
and returns the decoded JSON. What it guarantees:

- ``timeout`` bounds a whole request: connecting, the headers and the body (a server that sends its
  body a byte at a time is cut off when the request's time is up, not at each slow read);
- a response body is read up to ``MAX_BODY_BYTES`` (far above any real answer) and refused beyond;
- a request that meets a 429 or a 503, a dropped or refused connection or a read time-out is
  retried ``retries`` times with exponential backoff (``backoff * 2**attempt`` seconds, at most
  ``max_backoff``; a ``Retry-After`` header is honoured up to that bound); any other HTTP error,
  or the last failure, raises a ``ServerError`` of one line that names the server (its URL
  without credentials), the endpoint, the status and the start of the error body;
- a body that is not JSON, or JSON with NaN / Infinity, raises a ``ServerError`` (Python's json
  module would accept ``NaN``; a log-prob of NaN is never data);
- an API key is read from the environment variable named by ``api_key_env`` (spaces and line ends
  around it, as a key file saved on Windows has, are stripped; a key with control characters inside
  is refused) and sent as a bearer token; it never appears in a message, a manifest (``describe``)
  or a log: the URL is shown without user and password, and every form of a secret that a message
  may carry (as it is, escaped, URL-encoded, or inside a Basic token built from the URL's user and
  password) is redacted before it is shown; a server's text is shown with its control characters
  escaped (no terminal escape sequence reaches the terminal).

Nothing here knows a protocol (``_protocols`` does).
"""

from __future__ import annotations

import base64
import json
import math
import os
import threading
import time
import urllib.parse

from .._math._validation import check_int

__all__ = ["LLAMA_NEUTRAL_SAMPLERS", "MAX_BODY_BYTES", "ServerClient", "ServerError", "public_url", "shown"]

#: The largest response body read from a server: the log-probs of a long answer are a few MB.
MAX_BODY_BYTES = 64 * 2**20


class ServerError(ValueError):
    """A server that cannot be reached, answers with an error, or answers what cannot be used."""


def _port(parts):
    """The URL's port (None when it names none), or a ServerError for one out of range."""
    try:
        return parts.port
    except ValueError:
        raise ServerError(
            f"the URL's port is not a number in 1..65535: {parts.netloc.rsplit(':', 1)[-1][:20]!r}"
        ) from None


def public_url(url: str) -> str:
    """``url`` without user, password, query or fragment (what a manifest or a message may show)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    port = _port(parts)
    netloc = host + (f":{port}" if port is not None else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def check_url(url, what="--server") -> str:
    """An http(s) URL with a host and a port it names or implies (never port 0), or a ServerError naming
    ``what``."""
    if not isinstance(url, str) or not url:
        raise ServerError(f"{what} must be a URL such as http://127.0.0.1:8080; got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerError(
            f"{what} must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080; got "
            f"{public_url(url) if parts.hostname else shown(url)!r}"
        )
    try:
        port = _port(parts)
    except ServerError as exc:
        raise ServerError(f"{what}: {exc}") from None
    if port == 0:
        raise ServerError(
            f"{what} {public_url(url)}: port 0 is no server's port; give the port the server listens "
            "on (llama-server's default is 8080)"
        )
    return url


def shown(text) -> str:
    """A server's text as a message may show it: control characters (terminal escapes, bells) escaped."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(text))


def _forms(secret: str) -> list:
    """Every form in which ``secret`` may appear in a message: as it is, escaped (repr, JSON), and
    URL-encoded."""
    if not secret:
        return []
    forms = {
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret),
    }
    return sorted((f for f in forms if f), key=len, reverse=True)


class _Deadline(Exception):
    """A request's ``timeout`` ran out before its answer was whole (its headers or its body still arriving)."""


def _reject_constant(name):
    raise ValueError(f"{name} is not a number")


def strict_json(text: str):
    """JSON without NaN, Infinity or -Infinity (ValueError otherwise)."""
    return json.loads(text, parse_constant=_reject_constant)


class ServerClient:
    """JSON over HTTP to one server, with retries; see the module docstring for the guarantees.

    Parameters
    ----------
    url : str
        The server's base URL (``http://host:port``, an optional path prefix such as ``/v1`` is
        kept and endpoints are joined to it).
    api_key_env : str or None
        The name of an environment variable holding an API key (sent as ``Authorization: Bearer``).
    timeout : float
        Seconds for connecting and for each read (a long generation streams nothing until done:
        give enough for the longest request).
    retries : int
        Further attempts after a retryable failure (429, 503, dropped connection, time-out).
    backoff, max_backoff : float
        The first wait and the longest one, in seconds.
    """

    def __init__(
        self, url, *, api_key_env=None, timeout=600.0, retries=4, backoff=0.5, max_backoff=30.0, what="--server"
    ):
        try:
            import httpx
        except ImportError:
            raise ServerError("traces from servers need httpx: pip install -e '.[servers]'") from None
        check_url(url, what)
        for name, value, low in (("timeout", timeout, 0), ("backoff", backoff, 0), ("max_backoff", max_backoff, 0)):
            bad = isinstance(value, bool) or not isinstance(value, (int, float))
            if bad or not (math.isfinite(value) and value >= low):
                raise ServerError(f"{name} must be a finite number >= {low}; got {value!r}")
        check_int(retries, "retries", 0, error=ServerError)
        if timeout == 0:
            raise ServerError("timeout must be > 0 seconds")
        self.url = url.rstrip("/")
        self.what = what
        self.timeout = float(timeout)
        self.public = public_url(url)
        self.retries, self.backoff, self.max_backoff = int(retries), float(backoff), float(max_backoff)
        self._key = None
        headers = {"Accept": "application/json"}
        if api_key_env:
            if not isinstance(api_key_env, str) or not api_key_env.replace("_", "").isalnum():
                raise ServerError(f"--api-key-env must name an environment variable; got {api_key_env!r}")
            key = (os.environ.get(api_key_env) or "").strip()  # a key file's line end is not part of the key
            if not key:
                raise ServerError(f"--api-key-env {api_key_env}: that environment variable is empty or not set")
            if not key.isprintable():
                raise ServerError(
                    f"--api-key-env {api_key_env}: the key holds control characters (a line end "
                    "inside it?); an API key is one line of printable characters"
                )
            self._key = key
            headers["Authorization"] = f"Bearer {key}"
        parts = urllib.parse.urlsplit(url)
        auth = None
        self._secrets = []
        if parts.username:  # user:password in the URL: HTTP basic auth, unless an API key is given (bearer)
            basic = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
            token = base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()  # what a Basic header carries
            self._secrets = [s for s in (parts.password, basic[1], token, token.rstrip("=")) if s]
            auth = None if self._key else basic
        self._base = public_url(url)  # scheme, host, port and path prefix; credentials travel as auth
        self._httpx = httpx
        self._client_options = {"timeout": httpx.Timeout(timeout), "headers": headers, "auth": auth, "trust_env": False}
        self._client = httpx.Client(**self._client_options)

    def redact(self, text) -> str:
        """``text`` with every form of the API key and of the URL's password (and the Basic token built
        with it) replaced by ``***``."""
        text = str(text)
        for secret in [self._key, *self._secrets]:
            for form in _forms(secret or ""):
                text = text.replace(form, "***")
        return text

    def close(self):
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    #: Which protocol this client's server was taken to speak, and why (``detect_protocol``): said beside
    #: every error the server answers, so a 404 of a server two protocols recognise names the one assumed.
    assumed = ""

    def _fail(self, endpoint, what) -> ServerError:
        line = shown(" ".join(self.redact(what).split()))
        if len(line) > 300:
            line = line[:300] + "..."
        context = f" ({self.assumed})" if self.assumed else ""
        return ServerError(f"{self.what} {self.public}{endpoint}: {line}{context}")

    def request(self, method, endpoint, payload=None, *, parse=True):
        """The JSON the server answers to ``method endpoint`` with ``payload`` (or its text with
        ``parse=False``), retrying what may pass (see the class docstring)."""
        httpx = self._httpx
        url = self._base + endpoint
        last = None
        for attempt in range(self.retries + 1):
            wait = min(self.backoff * 2**attempt, self.max_backoff)
            try:
                status, headers, text = self._exchange(method, url, payload)
            except _Deadline:  # not retried: the same server would hold the next try as long
                raise self._fail(
                    endpoint,
                    f"did not complete its answer within --timeout {self.timeout:g} s "
                    "(it kept sending, slowly, or stalled); give a longer --timeout if it is only slow",
                ) from None
            except (
                httpx.ConnectError,
                httpx.ReadError,
                httpx.WriteError,
                httpx.RemoteProtocolError,
                httpx.ReadTimeout,
                httpx.ConnectTimeout,
                httpx.PoolTimeout,
            ) as exc:
                kind = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else "could not be reached"
                last = self._fail(endpoint, f"{kind} ({type(exc).__name__}: {exc}); is the server running there?")
            else:
                if status in (429, 503):
                    last = self._fail(endpoint, f"HTTP {status} (busy): {text[:200]}")
                    after = headers.get("Retry-After")
                    if after and after.replace(".", "", 1).isdigit():
                        wait = min(float(after), self.max_backoff)
                elif status >= 400:
                    raise self._fail(endpoint, f"HTTP {status}: {_error_text(text)}")
                else:
                    if not parse:
                        return text
                    try:
                        return strict_json(text)
                    except ValueError as exc:
                        raise self._fail(endpoint, f"answered malformed JSON ({exc}): {text[:120]!r}") from None
            if attempt < self.retries:
                time.sleep(wait)
        raise last

    def _exchange(self, method, url, payload):
        """(status, headers, text) of one request, read within ``timeout`` seconds in all (``_Deadline``
        beyond: a watchdog closes the connection of a request still running at the deadline, so a server that
        dribbles its headers or its body a byte at a time cannot hold it, each read being within httpx's own
        per-read timeout) and at most ``MAX_BODY_BYTES`` (a ServerError beyond)."""
        httpx = self._httpx
        options = {}
        if payload is not None:
            options = {"content": json.dumps(payload, allow_nan=False), "headers": {"Content-Type": "application/json"}}
        client, expired = self._client, threading.Event()

        def expire():
            expired.set()
            client.close()  # the blocked read fails at once; this client is replaced below

        watchdog = threading.Timer(self.timeout, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            with client.stream(method, url, timeout=httpx.Timeout(self.timeout), **options) as response:
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise ServerError(
                            f"{self.what} {self.public}: answered more than {MAX_BODY_BYTES // 2**20} "
                            "MiB; no answer this package asks for is that large: is it the server you meant?"
                        )
                    chunks.append(chunk)
                body = b"".join(chunks)
                return (
                    response.status_code,
                    response.headers,
                    body.decode(response.encoding or "utf-8", errors="replace"),
                )
        except Exception:
            if expired.is_set():
                raise _Deadline from None
            raise
        finally:
            watchdog.cancel()
            if expired.is_set():
                self._client = httpx.Client(**self._client_options)

    def get(self, endpoint, **kwargs):
        return self.request("GET", endpoint, **kwargs)

    def post(self, endpoint, payload, **kwargs):
        return self.request("POST", endpoint, payload, **kwargs)

    def probe(self, endpoint):
        """(status, JSON or None) of GET ``endpoint``, once, without retries or raising on HTTP errors
        (for detecting what a server is); a server that cannot be reached raises a ServerError."""
        httpx = self._httpx
        try:
            status, _, text = self._exchange("GET", self._base + endpoint, None)
        except _Deadline:
            raise self._fail(endpoint, f"did not complete its answer within --timeout {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise self._fail(
                endpoint, f"could not be reached ({type(exc).__name__}: {exc}); is the server running there?"
            ) from None
        try:
            body = strict_json(text)
        except ValueError:
            body = None
        return status, body


def _error_text(text: str) -> str:
    """The message of an error body: its JSON ``error`` / ``message`` / ``detail`` field, else the text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message", body)))
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:300]
    return str(body)[:300]


#: llama-server's samplers beyond temperature, top-k, top-p and min-p, each at its neutral value: a request that
#: reads or tests the law of those four sends these too, so that no server default changes it.
LLAMA_NEUTRAL_SAMPLERS = {
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "mirostat": 0,
}
