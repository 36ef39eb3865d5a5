"""The attachment header: fixed 27-byte layout, exact round trip, typed errors only."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wire import HEADER_SIZE, Header, MsgType, WireError, pack_header, unpack_header

headers = st.builds(
    Header,
    st.integers(0, 2**16 - 1),
    st.sampled_from(list(MsgType)),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**32 - 1),
)


@given(headers)
def test_header_round_trips_over_full_ranges(h):
    raw = pack_header(h)
    assert len(raw) == HEADER_SIZE == 27
    assert unpack_header(raw) == h


def test_header_offsets_match_the_spec():
    raw = Header(0x0102, MsgType.CHUNK, 0x1122334455667788, 0xAABBCCDD, -2, 0x01020304).pack()
    assert raw[0:2] == bytes([0x02, 0x01])
    assert raw[2] == 2
    assert raw[3:11] == (0x1122334455667788).to_bytes(8, "little")
    assert raw[11:15] == (0xAABBCCDD).to_bytes(4, "little")
    assert raw[15:23] == struct.pack("<q", -2)
    assert raw[23:27] == (0x01020304).to_bytes(4, "little")


@given(st.binary(max_size=64))
def test_arbitrary_attachments_give_only_wire_errors(data):
    try:
        h = unpack_header(data)
    except WireError as exc:
        assert exc.code == "MALFORMED"
    else:
        assert len(data) == HEADER_SIZE and isinstance(h.msg_type, MsgType)


@pytest.mark.parametrize(
    "field,value",
    [
        ("seq_id", -1),
        ("episode_id", 2**32),
        ("schema_version", 2**16),
        ("client_mono_ns", 2**63),
        ("session_epoch", True),
    ],
)
def test_out_of_range_fields_are_refused_at_pack(field, value):
    kwargs = dict(schema_version=1, msg_type=MsgType.OBS)
    kwargs[field] = value
    with pytest.raises(WireError, match=field):
        Header(**kwargs).pack()


def test_missing_attachment_names_the_problem():
    with pytest.raises(WireError, match="no attachment header"):
        unpack_header(None)
