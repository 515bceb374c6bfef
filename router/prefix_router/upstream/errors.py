"""What can go wrong on the way to an engine, sorted by what the proxy may do next."""

# An engine's response header longer than this is refused as malformed (the router passes on
# only a few short headers; 8 KiB is also aiohttp's server default).
MAX_HEADER_BYTES = 8190


class UpstreamError(Exception):
    """The engine's answer was cut short or malformed."""


class UpstreamConnectError(UpstreamError):
    """The request never reached the engine, or the connection closed before any byte of the
    answer: another engine may serve it."""


class UpstreamTimeout(TimeoutError):
    """Sent, and no byte for the read timeout: the engine may still be working on it, so it is
    not sent again."""


class UpstreamConnectTimeout(UpstreamTimeout):
    """No connection within the connect timeout: the request never reached the engine."""


class UpstreamHung(UpstreamError):
    """The router cut the request: the engine made no progress while it waited (it hangs), so
    nothing will come back from it; another engine may serve it."""
