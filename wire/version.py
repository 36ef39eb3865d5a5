"""Schema versioning: what this build speaks and the rule for bumping.

Rules (normative, see docs/wire-protocol.md "Versioning"):
- Adding an optional msgpack key is NOT a bump: decoders ignore unknown keys.
- Changing the attachment header layout, removing or retyping a key, changing a unit or the meaning
  of a value, or making an optional key required IS a bump of `SCHEMA_VERSION`.
- Each side declares the inclusive range it can decode. A session opens only if the client's
  version lies in the server's range; the server then speaks the client's version.
"""

SCHEMA_VERSION = 1
MIN_SUPPORTED = 1
MAX_SUPPORTED = 1


def is_supported(version: int, lo: int = MIN_SUPPORTED, hi: int = MAX_SUPPORTED) -> bool:
    return isinstance(version, int) and lo <= version <= hi
