"""Key expressions: sanitising, slugs, and that server wildcards match exactly their replica's keys."""

import pytest
import zenoh
from hypothesis import given
from hypothesis import strategies as st

from wire import ReplicaKeys, WireError, discovery_key, parse_client_key, sanitize, task_slug


@pytest.mark.parametrize("bad", ["", "a*b", "a$", "q?", "x#y", "a/b", "@verbatim", "has space", "tab\t", "x" * 129])
def test_sanitize_rejects_unsafe_segments(bad):
    with pytest.raises(WireError):
        sanitize(bad, "model_id")


def test_sanitize_names_the_segment_and_the_rule():
    with pytest.raises(WireError, match=r"model_id 'a/b' contains '/'"):
        sanitize("a/b", "model_id")


@given(st.text(max_size=60))
def test_task_slug_is_always_a_safe_chunk_or_a_typed_error(text):
    try:
        slug = task_slug(text)
    except WireError:
        assert not any(c.isalnum() and c.isascii() for c in text)
    else:
        assert sanitize(slug) == slug
        assert "//" not in slug and not slug.startswith("-")


def test_task_slug_examples():
    assert task_slug("Fold the towel / left") == "fold-the-towel-left"
    assert task_slug("") == "default"


def test_client_keys_parse_back():
    keys = ReplicaKeys("arm-flow", "main", "r1").client("Reach it", "robot-7")
    p = parse_client_key(keys.obs)
    assert (p.model_id, p.revision, p.replica_id, p.task_slug, p.client_uuid, p.topic) == (
        "arm-flow",
        "main",
        "r1",
        "reach-it",
        "robot-7",
        "obs",
    )


def _matches(pattern, key):
    return zenoh.KeyExpr(pattern).intersects(zenoh.KeyExpr(key))


def test_server_wildcards_match_their_replica_only():
    r0, r1 = ReplicaKeys("m", "main", "r0"), ReplicaKeys("m", "main", "r1")
    c0, c1 = r0.client("t", "robot-a"), r1.client("t", "robot-a")
    assert _matches(r0.all_obs, c0.obs)
    assert not _matches(r0.all_obs, c1.obs)
    for own in (r0.status, r0.session, r0.alive, c0.action, c0.alive, c0.reset):
        assert not _matches(r0.all_obs, own)
    assert _matches(r0.all_client_alive, c0.alive) and not _matches(r0.all_client_alive, r0.alive)
    assert _matches(r0.all_reset, c0.reset) and not _matches(r0.all_reset, c0.obs)


def test_discovery_reaches_every_replica_but_no_client_key():
    d = discovery_key("m", "main")
    assert _matches(d, ReplicaKeys("m", "main", "r0").status) and _matches(d, ReplicaKeys("m", "main", "zz").status)
    assert not _matches(d, ReplicaKeys("m", "main", "r0").client("t", "c").obs)
    assert not _matches(d, ReplicaKeys("other", "main", "r0").status)


def test_verbatim_root_is_not_matched_by_a_double_star():
    assert not _matches("**", ReplicaKeys("m", "main", "r0").status)
