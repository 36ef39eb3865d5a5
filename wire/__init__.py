"""The wire protocol: key expressions, attachment header, msgpack bodies, tensor and image codecs.

Everything both sides of the network agree on lives here and nowhere else. The normative
description is docs/wire-protocol.md; tests fail if the two drift.

Also at this floor, because every package above may import it and none below exists: the YAML
loader that keeps line numbers (`wire.yamlines`) and the "did you mean" rule (`wire.suggest`)
that the server manifest, the scenario language and the chaos timeline share; process helpers
(`wire.procs`) and the doc-table generator (`wire.docgen`). None of these imports torch.
"""

from wire.errors import WireError
from wire.header import HEADER_SIZE, Header, MsgType, pack_header, unpack_header
from wire.images import EncodedImage, decode_image, encode_image
from wire.keys import (
    DEFAULT_ROOT,
    ClientKeys,
    ReplicaKeys,
    discovery_key,
    parse_client_key,
    replicas_alive_key,
    sanitize,
    task_slug,
)
from wire.messages import (
    ActionChunk,
    DrainNotice,
    Error,
    ErrorCode,
    Message,
    Observation,
    Reset,
    ResetAck,
    SessionAck,
    SessionOpen,
    Status,
    StatusRequest,
    decode_message,
)
from wire.tensors import DEFAULT_LIMITS, Limits, decode_tensor, encode_tensor
from wire.version import MAX_SUPPORTED, MIN_SUPPORTED, SCHEMA_VERSION

__all__ = [name for name in dir() if not name.startswith("_")]
