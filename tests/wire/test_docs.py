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
    assert table in SPEC, (
        f"docs/wire-protocol.md table for {kind!r} differs from wire.messages: regenerate with python -m wire.docgen"
    )
    assert SPEC.count(table) == 1, f"docs/wire-protocol.md has the {kind!r} table more than once"


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


def _manifest_has(schema: dict, dotted: str) -> bool:
    node = schema
    for part in dotted.split("."):
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        props = node.get("properties")
        if not props or part not in props:
            return False
        node = props[part]
    return True


def test_every_manifest_key_the_spec_names_exists_in_the_manifest():
    # the spec once named limits.max_observation_bytes, which the manifest rejects (issue 23)
    import json

    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "schemas" / "manifest.schema.json").read_text())
    sections = "|".join(sorted(schema["properties"]))
    named = {
        k
        for k in re.findall(rf"`((?:{sections})\.[a-z_][a-z0-9_.]*)`", SPEC)
        if not k.endswith((".json", ".safetensors"))
    }  # a checkpoint file name, not a key
    assert named, "the spec names no manifest key: the pattern is wrong"
    missing = sorted(k for k in named if not _manifest_has(schema, k))
    assert not missing, f"docs/wire-protocol.md names manifest keys the manifest does not have: {missing}"


def test_the_spec_worked_tag_and_checkpoint_hash_follow_its_own_recipes():
    # recomputed here from the prose of 5.5 and 5.6 (hashlib/hmac only), then against wire.auth
    import hashlib
    import hmac

    from wire import auth

    key = bytes(range(32))
    parts = [b"reset", b"s-1", (3).to_bytes(8, "little")]
    tag = hmac.new(key, b"".join(len(p).to_bytes(4, "little") + p for p in parts), hashlib.sha256).hexdigest()[:32]
    assert f"the tag `{tag}`" in SPEC
    assert auth.reset_tag(key.hex(), "s-1", 3) == tag
    files = [("config.json", b"{}"), ("model.safetensors", b"w"), ("stats.json", b"{}")]
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + len(d).to_bytes(8, "little") + d for n, d in files))
    assert f"hash to\n`{digest.hexdigest()}`" in SPEC or f"`{digest.hexdigest()}`" in SPEC
