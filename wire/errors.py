"""The one exception type the wire layer raises.

Invariant: every malformed, oversize or type-confused input that reaches a decoder comes out as a
`WireError` carrying a machine-readable `code` and a human message naming the problem and what to
do; no other exception type escapes `wire.decode_*`.
"""

from __future__ import annotations


class WireError(ValueError):
    """A message could not be encoded or decoded.

    `code` is one of the `ErrorCode` words in `wire.messages` (e.g. ``MALFORMED``, ``TOO_LARGE``,
    ``SCHEMA_VERSION``); `field` names the offending field when there is one.
    """

    def __init__(self, code: str, message: str, field: str | None = None):
        self.code = code
        self.field = field
        super().__init__(f"[{code}] {message}")
