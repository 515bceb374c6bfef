"""The upstream client: keep-alive HTTP/1.1 POSTs to the engines, written on httptools (llhttp).

What the proxy needs of it, and no more: `post()` returns once the answer's status and headers
are in; the body then comes whole (`read()`) or as it arrives (`chunks()`); `close()` on an
answer still arriving closes its connection, which makes the engine abort the request.
Failures are sorted by what the proxy may do next (errors.py).

Why not aiohttp's ClientSession: against it, this client lowered the router's added p50 by
26% and raised its max req/s by 43% (`bench overhead`, 3 rounds; bench/results/upstream-ab/),
past the 20% a hand-written client must earn. It keeps what a client must have: response
headers bounded in size, outbound headers refused if they hold CR or LF, TCP_NODELAY on every
socket, connect and read timeouts, a bounded idle pool.

Retry policy for these non-idempotent POSTs: a request sent on a pooled connection that fails
before ANY byte of the answer came back is sent once more, on a fresh connection (the engine
may have closed the idle connection as we wrote: its keep-alive timeout racing ours). After
the first byte nothing is ever sent again; the proxy tries another engine only when the engine
cannot have answered (a connect error), since an engine that loses a request's connection
aborts it.

Layout: client.py (pools per backend, `post`), connection.py (one TCP connection fed to the
parser), response.py (the answer as the proxy reads it), errors.py.
"""

from .client import UpstreamClient
from .errors import (
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamHung,
    UpstreamTimeout,
)
from .response import UpstreamResponse

__all__ = [
    "UpstreamClient",
    "UpstreamConnectError",
    "UpstreamConnectTimeout",
    "UpstreamError",
    "UpstreamHung",
    "UpstreamResponse",
    "UpstreamTimeout",
]
