"""The proxy's errors: a failure with the HTTP status and the wording Toxiproxy gives it, and a start of a
proxy already started."""

from __future__ import annotations


class ProxyError(Exception):
    """A failure with an HTTP status, worded like Toxiproxy's errors."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.message, self.status = message, status


class AlreadyStarted(Exception):
    pass
