"""limit_data: the connection closes once `bytes` have passed in that direction."""

from tests.chaos.harness import connect, proxy_to


def test_connection_closes_after_the_limit(api, echo):
    s = connect(proxy_to(api, echo))
    api.add_toxic("p", "limit_data", {"bytes": 100}, stream="downstream")
    s.settimeout(3)
    got = b""
    try:
        for _ in range(10):
            s.sendall(b"a" * 50)
            chunk = s.recv(1000)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    assert 0 < len(got) <= 100, "at most `bytes` pass before the close"
    assert s.recv(1000) == b"", "then the connection is closed"
    s.close()
