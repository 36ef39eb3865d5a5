"""docs/wire-protocol.md stays in step with the code: tables, codes, types and hex examples."""

import re
from pathlib import Path

import pytest

from wire import ErrorCode, MsgType, decode_message, unpack_header
from wire.docgen import all_tables
from wire.golden import load_vectors
from wire.header import HEADER_SIZE
from wire.tensors import DTYPES

SPEC = (Path(__file__).resolve().parents[2] / "docs" / "wire-protocol.md").read_text()


@pytest.mark.parametrize("kind,table", sorted(all_tables().items()))
def test_every_field_table_is_the_generated_one(kind, table):
    assert table in SPEC, f"docs/wire-protocol.md table for {kind!r} differs from wire.messages: regenerate with python -m wire.docgen"


def test_every_error_code_is_documented():
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", SPEC, re.M))
    assert set(ErrorCode.all()) <= documented


def test_every_msg_type_and_dtype_is_documented():
    for t in MsgType:
        assert f"{t.value} {t.name}" in SPEC
    for d in DTYPES:
        assert f"| `{d}` |" in SPEC
    assert f"{HEADER_SIZE} bytes" in SPEC


def test_hex_examples_decode_to_the_golden_messages():
    blocks = re.findall(r"### `(\w+)`\n\n```\nheader: ([0-9a-f ]+)\nbody:\n([0-9a-f \n]+)```", SPEC)
    vectors = load_vectors()
    assert {b[0] for b in blocks} == set(vectors)
    for kind, header, body in blocks:
        assert header.replace(" ", "") == vectors[kind]["header"]
        raw = bytes.fromhex(body.replace(" ", "").replace("\n", ""))
        assert raw.hex() == vectors[kind]["body"]
        unpack_header(bytes.fromhex(header.replace(" ", "")))
        assert decode_message(raw).KIND == kind
