"""Server protocols for scripts and plugins: the base class a new protocol subclasses (defining it
registers it: ``detect_protocol`` asks it, ``--protocol`` offers it, a ``--plugin`` module's protocols
included), the records it returns, the checks every answer passes, and the transport it talks through.
``docs/contributing/house.md`` has a worked example. Needs the ``servers`` extra (httpx) to talk to a
server."""

from ._servers._http import ServerClient, ServerError
from ._servers._local_server import free_port, local_llama_server
from ._servers._protocol import (
    AlignmentError,
    Generation,
    ServerInfo,
    ServerProtocol,
    json_object,
    protocol_class,
    rows_from_entries,
    sampling_fields,
    token_id,
)
from ._servers._protocols import compare_tokenizers, detect_protocol, make_protocol, open_server, protocol_names

__all__ = [
    "AlignmentError",
    "Generation",
    "ServerClient",
    "ServerError",
    "ServerInfo",
    "ServerProtocol",
    "compare_tokenizers",
    "detect_protocol",
    "free_port",
    "json_object",
    "local_llama_server",
    "make_protocol",
    "open_server",
    "protocol_class",
    "protocol_names",
    "rows_from_entries",
    "sampling_fields",
    "token_id",
]
