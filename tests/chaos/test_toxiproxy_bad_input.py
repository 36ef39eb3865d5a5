"""Bad input to our proxy server's API, where ours answers what the real Toxiproxy leaves open or does not test:
the JSON decoder and the HTTP reader (property tests: any bytes get an answer, never an exception), read timeouts,
chunked bodies, name lengths, the int64 bound on attributes, the command line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from urllib.parse import quote

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.toxiproxy.__main__ import parse_args
from chaos.toxiproxy.api import Api, BadRequest, decode_body
from chaos.toxiproxy.collection import ProxyCollection
from chaos.toxiproxy.proxy import MAX_NAME_CHARS, ProxyError
from chaos.toxiproxy.server import ServerThread
from chaos.toxiproxy.toxics import LatencyToxic, LossToxic, SlicerToxic
from chaos.toxiproxy.toxics.toxic import INT64, BigInt

# --- the JSON decoder ------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=INT64.start, max_value=INT64.stop - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_decode_body_reads_back_any_json_value_of_finite_numbers_and_int64s(value):
    assert decode_body(json.dumps(value).encode()) == value


@given(st.integers() | st.integers(min_value=10**30, max_value=10**60))
def test_an_integer_beyond_int64_is_kept_as_its_text(n):
    value = decode_body(str(n).encode())
    if n in INT64:
        assert value == n and isinstance(value, int)
    else:
        assert isinstance(value, BigInt) and value.text == str(n)


@given(st.binary(max_size=200) | st.text(alphabet='[]{}":,0123456789.eE+-NaInfinity tru', max_size=200).map(str.encode))
def test_decode_body_answers_any_bytes_with_a_value_or_a_400(body):
    try:
        value = decode_body(body)
    except ProxyError as err:
        assert err.status == 400 and err.message.startswith("bad request body: ")
        return
    json.dumps(value, default=repr, allow_nan=False)  # nothing decoded is NaN or infinite


def test_long_numbers_and_deep_nesting_are_values_or_400s_never_python_errors():
    assert decode_body(b"1" * 5000).text == "1" * 5000  # a value (a BigInt); any field it lands in refuses it
    for body in (b"1" * 5000 + b".5", b"[" * 100_000, b'{"a":' * 50_000):
        with pytest.raises(ProxyError) as err:
            decode_body(body)
        assert err.value.status == 400


@pytest.mark.parametrize("body", [b'{"x": 1e999}', b'{"x": [-1e400]}', b"NaN", b'{"x": Infinity}'])
def test_a_non_finite_number_anywhere_is_a_400(body):
    with pytest.raises(ProxyError) as err:
        decode_body(body)
    assert err.value.status == 400


# --- the HTTP reader ---------------------------------------------------------------------------------------------


async def _read_all(data: bytes, **timeouts):
    reader = asyncio.StreamReader(limit=64 * 1024)
    reader.feed_data(data)
    reader.feed_eof()
    return await Api(ProxyCollection(), **timeouts)._read_request(reader)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300)
    | st.lists(
        st.sampled_from(
            [
                b"POST /proxies HTTP/1.1\r\n",
                b"Content-Length: ",
                b"Transfer-Encoding: chunked\r\n",
                b"\r\n",
                b"5",
                b"-5",
                b"ZZ",
                b"FFFFFFFFFFFF",
                b";ext",
                b"abcde",
                b"0\r\n",
                b"x: y\r\n",
                b"\n",
                b"GET",
            ]
        ),
        max_size=12,
    ).map(b"".join)
)
def test_any_bytes_read_as_a_request_none_or_a_bad_request_answer(data):
    try:
        request = asyncio.run(_read_all(data))
    except BadRequest as bad:
        assert bad.status in (400, 413) and bad.response().encode(keep_alive=False).startswith(b"HTTP/1.1 4")
        return
    assert request is None or len(request) == 5


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=1, max_value=300), max_size=8), st.booleans())
def test_a_body_reads_back_whole_by_content_length_or_in_any_chunking(body, cuts, chunked):
    if chunked:
        wire, rest = b"", body
        for n in cuts + [len(body)]:
            piece, rest = rest[:n], rest[n:]
            if piece:
                wire += b"%x;ext=1\r\n%s\r\n" % (len(piece), piece)
        head = b"POST /populate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        data = head + wire + b"0\r\nTrailer: x\r\n\r\n"
    else:
        data = b"POST /populate HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    assert asyncio.run(_read_all(data))[4] == body


@pytest.mark.parametrize(
    "data, status, text",
    [
        (b"POST /proxies HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n", 400, b"bad chunk size"),
        (
            b"POST /proxies HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nabcde\r\n0\r\n\r\n",
            400,
            b"bad chunk size",
        ),
        (b"POST /proxies HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFF\r\nabc", 413, b"Too Large"),
        (b"POST /proxies HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", 400, b"malformed chunked"),
        (b"POST /proxies HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, b"bad Content-Length"),
        (b"POST /proxies HTTP/1.1\r\nContent-Length: +5\r\n\r\nabcde", 400, b"bad Content-Length"),
        (b"POST /proxies HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 413, b"Too Large"),
        (b"POST /proxies HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}", 400, b"unexpected EOF"),
    ],
    ids=[
        "chunk-size-ZZ",
        "chunk-size-0x5",
        "chunk-size-huge",
        "chunk-no-crlf",
        "length-negative",
        "length-plus",
        "length-5000-digits",
        "body-cut-short",
    ],
)
def test_bad_framing_is_answered_with_what_is_wrong(data, status, text):
    with pytest.raises(BadRequest) as bad:
        asyncio.run(_read_all(data))
    assert bad.value.status == status and text in bad.value.response().body


@contextlib.asynccontextmanager
async def _api_port(**timeouts):
    server = await asyncio.start_server(Api(ProxyCollection(), **timeouts).serve_connection, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _reply(port: int, data: bytes) -> bytes:
    """Send `data`, keep the connection open, and read until the server closes it (bounded: a hang fails)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "data",
    [
        b"POST /proxies HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}",  # body shorter than its length
        b"GET /version HTTP/1.1\r\nHost: x",  # headers never end
        b"GET /vers",  # request line never ends
        b"POST /proxies HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",  # chunk never ends
    ],
)
def test_a_request_that_stops_arriving_gets_a_408_and_the_connection_closes(data):
    async def main():
        async with _api_port(read_timeout_s=0.2) as port:
            return await _reply(port, data)

    reply = asyncio.run(main())
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"Connection: close" in reply


def test_an_idle_connection_is_closed_without_an_answer_and_a_whole_request_is_answered():
    async def main():
        async with _api_port(idle_timeout_s=0.2, read_timeout_s=0.2) as port:
            return await _reply(port, b""), await _reply(port, b"GET /version HTTP/1.1\r\nConnection: close\r\n\r\n")

    idle, whole = asyncio.run(main())
    assert idle == b"" and whole.startswith(b"HTTP/1.1 200 OK")


# --- names, attributes, the command line -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with ServerThread() as s:
        yield s


def test_the_longest_name_allowed_stays_addressable_and_a_longer_one_is_refused(server):
    url = server.api_url
    name = "\U0001f600" * MAX_NAME_CHARS  # 4 UTF-8 bytes a character: 12 bytes each percent-encoded
    r = requests.post(f"{url}/proxies", json={"name": name, "listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"})
    assert r.status_code == 201
    base = f"{url}/proxies/{quote(name, safe='')}"
    assert requests.post(f"{base}/toxics", json={"name": name, "type": "latency"}).status_code == 200
    assert requests.get(f"{base}/toxics/{quote(name, safe='')}").json()["name"] == name
    assert requests.delete(f"{base}/toxics/{quote(name, safe='')}").status_code == 204
    assert requests.post(f"{base}/toxics", json={"name": name + "x", "type": "latency"}).status_code == 400
    assert requests.delete(base).status_code == 204
    r = requests.post(f"{url}/proxies", json={"name": "x" * (MAX_NAME_CHARS + 1), "upstream": "127.0.0.1:1"})
    assert r.status_code == 400 and r.json()["error"] == f"name too long: at most {MAX_NAME_CHARS} characters"
    r = requests.post(f"{url}/populate", json=[{"name": "x" * (MAX_NAME_CHARS + 1), "upstream": "127.0.0.1:1"}])
    assert r.status_code == 400 and r.json() == {
        "error": f"name too long: at most {MAX_NAME_CHARS} characters at proxy 1",
        "status": 400,
        "proxies": None,
    }
    assert requests.get(f"{url}/proxies").json() == {}


def test_a_huge_float_in_a_key_no_toxic_knows_is_refused_too(server):
    r = requests.post(f"{server.api_url}/proxies", data=b'{"name": "n", "upstream": "127.0.0.1:1", "x": 1e999}')
    assert r.status_code == 400 and requests.get(f"{server.api_url}/proxies").json() == {}


int64s = st.integers(min_value=INT64.start, max_value=INT64.stop - 1)


@given(int64s, int64s)
def test_any_int64_latency_and_jitter_give_a_finite_delay_the_loop_can_time(latency, jitter):
    delay = LatencyToxic(latency=latency, jitter=jitter).delay_s()
    assert math.isfinite(delay)
    loop = asyncio.new_event_loop()
    try:
        loop.call_later(max(delay, 0), lambda: None).cancel()
    finally:
        loop.close()


@given(int64s, int64s, int64s, st.integers(min_value=0, max_value=1 << 16))
def test_any_int64_loss_and_slicer_attributes_compute_without_overflow(a, b, c, nbytes):
    waits = LossToxic(probability=0.5, rto_ms=a, max_rto_ms=b, segment_size=c).hold_times_s(nbytes)
    assert all(math.isfinite(w) and w >= 0 for w in waits)
    pieces = SlicerToxic(average_size=a, size_variation=b, delay=c).offsets(nbytes)
    assert [p for piece in pieces for p in range(*piece)] == list(range(nbytes))


@pytest.mark.parametrize("port", ["99999", "-1", "65536", "x"])
def test_a_port_out_of_range_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--port", port])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("toxiproxy-server-py: error: argument -port/--port: ")
