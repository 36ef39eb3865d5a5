"""Toxiproxy's HTTP API on asyncio: same routes, JSON shapes, status codes and error words.

    GET  /version                          POST /reset            POST /populate
    GET  /proxies   POST /proxies          GET|POST|PATCH|DELETE /proxies/{proxy}
    GET|POST /proxies/{proxy}/toxics       GET|POST|PATCH|DELETE /proxies/{proxy}/toxics/{toxic}
    GET  /proxies/{proxy}/fidelity         (ours, not Toxiproxy's: delay applied vs asked per direction)
    GET  /proxies/{proxy}/fidelity/asked   (ours: per direction, the most asked of a chunk in each 100 ms)

Owns request parsing (a small HTTP/1.1 server with keep-alive) and the mapping from requests to
the proxy collection. Invariant: any request, however malformed, gets an HTTP answer (errors as
`{"error": msg, "status": code}`; one that does not arrive whole within READ_TIMEOUT_S of its first
byte a 408) and never takes the proxy down; every response carries an `X-Toxiproxy-Request-Id`, and
its JSON is JSON (no NaN or Infinity: the request bodies that could bring one in are refused).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
from urllib.parse import unquote

from chaos.toxiproxy.collection import PROXY_EXISTS, ProxyCollection, proxy_fields
from chaos.toxiproxy.proxy import Proxy, ProxyError, check_name, make_toxic, toxicity_value
from chaos.toxiproxy.toxics.toxic import INT64, BadAttribute, BigInt, _json_kind

log = logging.getLogger("chaos.toxiproxy.api")

TOXIPROXY_VERSION = "2.12.0"  # the upstream API we follow
VERSION = f"{TOXIPROXY_VERSION}+chaos.py"  # what /version answers; `+chaos.py` tells us apart from the real one

TOXIC_NOT_FOUND = ProxyError("toxic not found", 404)
TOXIC_EXISTS = ProxyError("toxic already exists", 409)

MAX_HEADER_BYTES = 64 * 1024  # the request line and headers together (also asyncio's longest line)
MAX_BODY_BYTES = 16 * 1024 * 1024
IDLE_TIMEOUT_S = 60.0  # how long a connection may wait for its next request (Toxiproxy's IdleTimeout)
READ_TIMEOUT_S = 15.0  # how long a request may take to arrive whole, from its first byte (Toxiproxy's ReadTimeout)

_REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
}
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]+")
_DIGITS = re.compile(r"[0-9]+")


class Response:
    __slots__ = ("status", "body", "content_type")

    def __init__(self, status: int, body: bytes = b"", content_type: str = "application/json"):
        self.status, self.body, self.content_type = status, body, content_type

    @classmethod
    def json(cls, status: int, obj) -> Response:
        # allow_nan=False: a non-finite number would be written as NaN, which no JSON parser reads; it raises (a 500)
        return cls(status, json.dumps(obj, separators=(",", ":"), allow_nan=False).encode())

    @classmethod
    def error(cls, err: ProxyError) -> Response:
        return cls(
            err.status, json.dumps({"error": err.message, "status": err.status}, separators=(",", ":")).encode() + b"\n"
        )

    def encode(self, keep_alive: bool) -> bytes:
        head = [
            f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}",
            f"X-Toxiproxy-Request-Id: {os.urandom(10).hex()}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        if self.status != 204:
            head += [f"Content-Type: {self.content_type}", f"Content-Length: {len(self.body)}"]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (self.body if self.status != 204 else b"")


class BadRequest(Exception):
    """A request that cannot be read: answered with `status` and one line of plain text, then the connection closes."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status, self.text = status, text

    def response(self) -> Response:
        return Response(self.status, self.text.encode() + b"\n", "text/plain; charset=utf-8")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: no float64 holds it, in Go either
        raise ProxyError(f"bad request body: json: cannot unmarshal number {text} into Go value of type float64", 400)
    return value


def _int64_or_big(text: str) -> int | BigInt:
    if len(text) <= 20:  # a sign and int64's 19 digits: cheap to convert
        value = int(text)
        if value in INT64:
            return value
    return BigInt(text)


def _not_json(text: str):  # NaN, Infinity, -Infinity: Python's json reads them, JSON (and Go) does not
    where = "in numeric literal" if text.startswith("-") else "looking for beginning of value"
    raise ProxyError(f"bad request body: invalid character '{text.lstrip('-')[0]}' {where}", 400)


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_int=_int64_or_big, parse_constant=_not_json)


def decode_body(body: bytes):
    """The first JSON value of the body, as Go's json.Decoder reads it (trailing bytes ignored).

    Every number in the value is finite and every int fits int64 (a longer integer is a `BigInt`, which no field
    takes), so nothing decoded can make a response non-JSON or a toxic's arithmetic overflow. Anything else,
    nesting too deep for Python's parser included, is a 400."""
    text = body.decode("utf-8", errors="replace").lstrip()
    if not text:
        raise ProxyError("bad request body: EOF", 400)
    try:
        value, _ = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        raise ProxyError(f"bad request body: {exc.msg} (line {exc.lineno} column {exc.colno})", 400) from None
    except RecursionError:
        raise ProxyError("bad request body: exceeded max depth", 400) from None
    return value


def _object(value, go_type: str) -> dict:
    if not isinstance(value, dict):
        raise ProxyError(
            f"bad request body: json: cannot unmarshal {_json_kind(value)} into Go value of type {go_type}", 400
        )
    return value


def _set_attributes(wrapper, data: dict) -> None:
    """The body's "attributes" onto the toxic; a bad one is a 400 that names it."""
    try:
        wrapper.toxic.update_attributes(data.get("attributes"))
    except BadAttribute as exc:
        raise ProxyError(f"bad request body: {exc}", 400) from None


class Api:
    """Routes and handlers over a `ProxyCollection`."""

    def __init__(
        self,
        collection: ProxyCollection,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ):
        self.collection = collection
        self.idle_timeout_s, self.read_timeout_s = idle_timeout_s, read_timeout_s
        P, T = r"(?P<proxy>[^/]+)", r"(?P<toxic>[^/]+)"
        self.routes: list[tuple[re.Pattern, dict]] = [
            (re.compile(r"/reset"), {"POST": self.reset}),
            (re.compile(r"/proxies"), {"GET": self.proxy_index, "POST": self.proxy_create}),
            (re.compile(r"/populate"), {"POST": self.populate}),
            (
                re.compile(rf"/proxies/{P}"),
                {
                    "GET": self.proxy_show,
                    "POST": self.proxy_update,
                    "PATCH": self.proxy_update,
                    "DELETE": self.proxy_delete,
                },
            ),
            (re.compile(rf"/proxies/{P}/toxics"), {"GET": self.toxic_index, "POST": self.toxic_create}),
            (re.compile(rf"/proxies/{P}/fidelity"), {"GET": self.proxy_fidelity}),
            (re.compile(rf"/proxies/{P}/fidelity/asked"), {"GET": self.proxy_asked}),
            (
                re.compile(rf"/proxies/{P}/toxics/{T}"),
                {
                    "GET": self.toxic_show,
                    "POST": self.toxic_update,
                    "PATCH": self.toxic_update,
                    "DELETE": self.toxic_delete,
                },
            ),
            (re.compile(r"/version"), {"GET": self.version}),
        ]

    async def dispatch(self, method: str, path: str, headers: dict, body: bytes) -> Response:
        if headers.get("user-agent", "").startswith("Mozilla/"):
            return Response(403, b"User agent not allowed\n", "text/plain; charset=utf-8")
        path = path.split("?", 1)[0]
        for pattern, methods in self.routes:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            handler = methods.get(method)
            if handler is None:
                return Response(405, b"", "text/plain; charset=utf-8")
            params = {k: unquote(v) for k, v in m.groupdict().items()}
            try:
                return await handler(body, **params)
            except ProxyError as err:
                return Response.error(err)
            except Exception as exc:  # a bug answers 500; the proxy keeps running
                log.exception("%s %s failed", method, path)
                return Response.error(ProxyError(f"{type(exc).__name__}: {exc}", 500))
        return Response(404, b"404 page not found\n", "text/plain; charset=utf-8")

    # --- handlers: each mirrors the Toxiproxy handler of the same name -----------------------

    async def version(self, body: bytes) -> Response:
        return Response(200, json.dumps({"version": VERSION}).encode() + b"\n", "application/json;charset=utf-8")

    async def reset(self, body: bytes) -> Response:
        async with self.collection.lock:
            await self.collection.reset()
        return Response(204)

    async def proxy_index(self, body: bytes) -> Response:
        return Response.json(200, {name: p.to_json() for name, p in self.collection.proxies.items()})

    async def proxy_create(self, body: bytes) -> Response:
        data = _object(decode_body(body), "toxiproxy.Proxy")
        name, listen, upstream, enabled = proxy_fields(data, {"listen": "", "enabled": True})
        if not name:
            raise ProxyError("missing required field: name", 400)
        if not upstream:
            raise ProxyError("missing required field: upstream", 400)
        check_name(name)
        async with self.collection.lock:
            if name in self.collection.proxies:
                raise PROXY_EXISTS
            proxy = Proxy(name, listen, upstream)
            await self.collection.add(proxy, enabled)
            return Response.json(201, proxy.to_json())

    async def populate(self, body: bytes) -> Response:
        try:
            entries = decode_body(body)
        except ProxyError as err:
            return Response.json(err.status, {"error": err.message, "status": err.status, "proxies": None})
        async with self.collection.lock:
            done, err = await self.collection.populate(entries)
        proxies = [p.to_json() for p in done] or None  # Go marshals an empty slice here as null
        if err is not None:
            return Response.json(err.status, {"error": err.message, "status": err.status, "proxies": proxies})
        return Response.json(201, {"proxies": proxies})

    async def proxy_show(self, body: bytes, proxy: str) -> Response:
        return Response.json(200, self.collection.get(proxy).to_json())

    async def proxy_fidelity(self, body: bytes, proxy: str) -> Response:
        return Response.json(200, self.collection.get(proxy).fidelity_json())

    async def proxy_asked(self, body: bytes, proxy: str) -> Response:
        return Response.json(200, self.collection.get(proxy).asked_json())

    async def proxy_update(self, body: bytes, proxy: str) -> Response:
        async with self.collection.lock:
            p = self.collection.get(proxy)
            data = _object(decode_body(body), "toxiproxy.Proxy")
            _, listen, upstream, enabled = proxy_fields(
                data, {"name": p.name, "listen": p.listen, "upstream": p.upstream, "enabled": p.enabled}
            )
            await p.update(listen, upstream, enabled)
            return Response.json(200, p.to_json())

    async def proxy_delete(self, body: bytes, proxy: str) -> Response:
        async with self.collection.lock:
            await self.collection.remove(proxy)
        return Response(204)

    async def toxic_index(self, body: bytes, proxy: str) -> Response:
        return Response.json(200, self.collection.get(proxy).toxics.to_json())

    async def toxic_create(self, body: bytes, proxy: str) -> Response:
        async with self.collection.lock:
            p = self.collection.get(proxy)
            data = _object(decode_body(body), "toxics.ToxicWrapper")
            wrapper = make_toxic(data)
            if p.toxics.find(wrapper.name) is not None:
                raise TOXIC_EXISTS
            _set_attributes(wrapper, data)
            await p.toxics.add(wrapper)
            return Response.json(200, wrapper.to_json())

    def _toxic(self, proxy: str, toxic: str):
        """(proxy, toxic wrapper) by their names; 404 "proxy not found" or "toxic not found"."""
        p = self.collection.get(proxy)
        wrapper = p.toxics.find(toxic)
        if wrapper is None:
            raise TOXIC_NOT_FOUND
        return p, wrapper

    async def toxic_show(self, body: bytes, proxy: str, toxic: str) -> Response:
        _, wrapper = self._toxic(proxy, toxic)
        return Response.json(200, wrapper.to_json())

    async def toxic_update(self, body: bytes, proxy: str, toxic: str) -> Response:
        async with self.collection.lock:
            p, wrapper = self._toxic(proxy, toxic)
            data = _object(decode_body(body), "toxics.ToxicWrapper")
            toxicity = data.get("toxicity")
            if toxicity is not None:  # Go decodes into an anonymous struct: its field is ".toxicity"
                toxicity = toxicity_value(toxicity, ".toxicity")
            _set_attributes(wrapper, data)
            if toxicity is not None:
                wrapper.toxicity = toxicity
            await p.toxics.update(wrapper)
            return Response.json(200, wrapper.to_json())

    async def toxic_delete(self, body: bytes, proxy: str, toxic: str) -> Response:
        async with self.collection.lock:
            p, wrapper = self._toxic(proxy, toxic)
            await p.toxics.remove(wrapper)
        return Response(204)

    # --- HTTP/1.1 -------------------------------------------------------------------------------

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    request = await self._read_request(reader)
                except BadRequest as bad:  # unreadable: answer and hang up
                    writer.write(bad.response().encode(keep_alive=False))
                    await writer.drain()
                    break
                if request is None:
                    break
                method, target, version, headers, body = request
                keep_alive = (
                    headers.get("connection", "").lower() != "close"
                    if version == "HTTP/1.1"
                    else headers.get("connection", "").lower() == "keep-alive"
                )
                response = await self.dispatch(method, target, headers, body)
                log.debug("%s %s -> %d", method, target, response.status)
                writer.write(response.encode(keep_alive))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader):
        """(method, target, version, headers, body), or None when the peer closed or sat idle for idle_timeout_s
        before a request began. Raises BadRequest for a request it cannot read, or one that has not arrived whole
        read_timeout_s after its first byte (a 408: a request line, headers or body cut short never hold a
        connection open)."""
        try:
            first = await asyncio.wait_for(reader.read(1), self.idle_timeout_s)
        except TimeoutError:
            return None
        if not first:
            return None
        try:
            async with asyncio.timeout(self.read_timeout_s):
                return await self._read_whole(reader, first)
        except TimeoutError:
            raise BadRequest(408, "408 Request Timeout") from None
        except asyncio.IncompleteReadError:
            raise BadRequest(400, "400 Bad Request: unexpected EOF") from None
        except (ValueError, asyncio.LimitOverrunError):  # asyncio's readline past its limit (MAX_HEADER_BYTES)
            raise BadRequest(400, "400 Bad Request: line too long") from None

    async def _read_whole(self, reader: asyncio.StreamReader, first: bytes):
        line = first if first == b"\n" else first + await reader.readline()
        while line in (b"\r\n", b"\n"):
            line = await reader.readline()
        if not line:
            return None
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise BadRequest(400, "400 Bad Request")
        method, target, version = parts
        headers: dict[str, str] = {}
        size = len(line)
        while True:
            hline = await reader.readline()
            size += len(hline)
            if size > MAX_HEADER_BYTES:
                raise BadRequest(400, "400 Request Header Fields Too Large")
            if hline in (b"\r\n", b"\n", b""):
                break
            key, sep, value = hline.decode("latin-1").partition(":")
            if not sep:
                raise BadRequest(400, "400 Bad Request: malformed header")
            headers[key.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._read_chunked(reader)
        else:
            length = headers.get("content-length", "") or "0"
            if not _DIGITS.fullmatch(length):  # what int() takes beyond digits (-5, +5, 5_0, spaces) is no length
                raise BadRequest(400, "400 Bad Request: bad Content-Length")
            digits = length.lstrip("0")
            if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits or "0") > MAX_BODY_BYTES:
                raise BadRequest(413, "413 Request Entity Too Large")
            body = await reader.readexactly(int(digits or "0"))
        return method.upper(), target, version, headers, body

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        parts, total = [], 0
        while True:
            size_text = (await reader.readline()).split(b";")[0].strip()
            if not _CHUNK_SIZE.fullmatch(size_text):  # hex digits only (int(x, 16) also takes 0x, _ and signs)
                raise BadRequest(400, "400 Bad Request: bad chunk size")
            size = int(size_text, 16)  # linear in the digits: base 16 has no digit limit
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > MAX_BODY_BYTES:
                raise BadRequest(413, "413 Request Entity Too Large")
            parts.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise BadRequest(400, "400 Bad Request: malformed chunked encoding")
