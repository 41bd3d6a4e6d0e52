"""Server protocols for scripts and plugins: the base class a new protocol subclasses (defining it
registers it: ``detect_protocol`` asks it, ``--protocol`` offers it, a ``--plugin`` module's protocols
included), the records it returns, the checks every answer passes, and the transport it talks through.
``docs/contributing/house.md`` has a worked example. Needs the ``servers`` extra (httpx) to talk to a
server."""

from ._servers import _protocol
from ._servers._http import ServerClient, ServerError
from ._servers._local_server import free_port, local_llama_server
from ._servers._protocol import *  # noqa: F403 (the base class, its records and checks)
from ._servers._protocol import protocol_class
from ._servers._protocols import compare_tokenizers, open_server

__all__ = [
    *_protocol.__all__,
    "ServerClient",
    "ServerError",
    "compare_tokenizers",
    "free_port",
    "local_llama_server",
    "open_server",
    "protocol_class",
]
