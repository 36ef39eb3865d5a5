"""Toxiproxy's HTTP API on asyncio: same routes, JSON shapes, status codes and error words.

    GET  /version                          POST /reset            POST /populate
    GET  /proxies   POST /proxies          GET|POST|PATCH|DELETE /proxies/{proxy}
    GET|POST /proxies/{proxy}/toxics       GET|POST|PATCH|DELETE /proxies/{proxy}/toxics/{toxic}
    GET  /proxies/{proxy}/fidelity         (ours, not Toxiproxy's: delay applied vs asked per direction)
    GET  /proxies/{proxy}/fidelity/asked   (ours: per direction, the most asked of a chunk in each 100 ms)

Owns request parsing (a small HTTP/1.1 server with keep-alive) and the mapping from requests to
the proxy collection. Invariant: any request, however malformed, gets an HTTP answer (errors as
`{"error": msg, "status": code}`) and never takes the proxy down; every response carries an
`X-Toxiproxy-Request-Id`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from urllib.parse import unquote

from chaos.toxiproxy.collection import PROXY_EXISTS, ProxyCollection, proxy_fields
from chaos.toxiproxy.proxy import Proxy, ProxyError, make_toxic
from chaos.toxiproxy.toxics.toxic import BadAttribute, _json_kind

log = logging.getLogger("chaos.toxiproxy.api")

TOXIPROXY_VERSION = "2.12.0"  # the upstream API we follow
VERSION = f"{TOXIPROXY_VERSION}+chaos.py"  # what /version answers; `+chaos.py` tells us apart from the real one

TOXIC_NOT_FOUND = ProxyError("toxic not found", 404)
TOXIC_EXISTS = ProxyError("toxic already exists", 409)

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
IDLE_TIMEOUT_S = 60.0

_REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Request Entity Too Large", 500: "Internal Server Error"}


class Response:
    __slots__ = ("status", "body", "content_type")

    def __init__(self, status: int, body: bytes = b"", content_type: str = "application/json"):
        self.status, self.body, self.content_type = status, body, content_type

    @classmethod
    def json(cls, status: int, obj) -> "Response":
        return cls(status, json.dumps(obj, separators=(",", ":")).encode())

    @classmethod
    def error(cls, err: ProxyError) -> "Response":
        return cls(err.status, json.dumps({"error": err.message, "status": err.status},
                                          separators=(",", ":")).encode() + b"\n")

    def encode(self, keep_alive: bool) -> bytes:
        head = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}",
                f"X-Toxiproxy-Request-Id: {os.urandom(10).hex()}",
                f"Connection: {'keep-alive' if keep_alive else 'close'}"]
        if self.status != 204:
            head += [f"Content-Type: {self.content_type}", f"Content-Length: {len(self.body)}"]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (self.body if self.status != 204 else b"")


def decode_body(body: bytes):
    """The first JSON value of the body, as Go's json.Decoder reads it (trailing bytes ignored)."""
    text = body.decode("utf-8", errors="replace").lstrip()
    if not text:
        raise ProxyError("bad request body: EOF", 400)
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise ProxyError(f"bad request body: {exc.msg} (line {exc.lineno} column {exc.colno})", 400) from None
    return value


def _object(value, go_type: str) -> dict:
    if not isinstance(value, dict):
        raise ProxyError(f"bad request body: json: cannot unmarshal {_json_kind(value)} into Go value of type {go_type}",
                         400)
    return value


def _set_attributes(wrapper, data: dict) -> None:
    """The body's "attributes" onto the toxic; a bad one is a 400 that names it."""
    try:
        wrapper.toxic.update_attributes(data.get("attributes"))
    except BadAttribute as exc:
        raise ProxyError(f"bad request body: {exc}", 400) from None


class Api:
    """Routes and handlers over a `ProxyCollection`."""

    def __init__(self, collection: ProxyCollection):
        self.collection = collection
        P, T = r"(?P<proxy>[^/]+)", r"(?P<toxic>[^/]+)"
        self.routes: list[tuple[re.Pattern, dict]] = [
            (re.compile(r"/reset"), {"POST": self.reset}),
            (re.compile(r"/proxies"), {"GET": self.proxy_index, "POST": self.proxy_create}),
            (re.compile(r"/populate"), {"POST": self.populate}),
            (re.compile(rf"/proxies/{P}"), {"GET": self.proxy_show, "POST": self.proxy_update,
                                            "PATCH": self.proxy_update, "DELETE": self.proxy_delete}),
            (re.compile(rf"/proxies/{P}/toxics"), {"GET": self.toxic_index, "POST": self.toxic_create}),
            (re.compile(rf"/proxies/{P}/fidelity"), {"GET": self.proxy_fidelity}),
            (re.compile(rf"/proxies/{P}/fidelity/asked"), {"GET": self.proxy_asked}),
            (re.compile(rf"/proxies/{P}/toxics/{T}"), {"GET": self.toxic_show, "POST": self.toxic_update,
                                                       "PATCH": self.toxic_update, "DELETE": self.toxic_delete}),
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
                data, {"name": p.name, "listen": p.listen, "upstream": p.upstream, "enabled": p.enabled})
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
            if toxicity is not None and (isinstance(toxicity, bool) or not isinstance(toxicity, (int, float))):
                raise ProxyError(f"bad request body: json: cannot unmarshal {_json_kind(toxicity)} into Go struct field "
                                 ".toxicity of type float32", 400)
            _set_attributes(wrapper, data)
            if toxicity is not None:
                wrapper.toxicity = float(toxicity)
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
                request = await self._read_request(reader)
                if request is None:
                    break
                if isinstance(request, Response):  # unparseable: answer and hang up
                    writer.write(request.encode(keep_alive=False))
                    await writer.drain()
                    break
                method, target, version, headers, body = request
                keep_alive = headers.get("connection", "").lower() != "close" if version == "HTTP/1.1" \
                    else headers.get("connection", "").lower() == "keep-alive"
                response = await self.dispatch(method, target, headers, body)
                log.debug("%s %s -> %d", method, target, response.status)
                writer.write(response.encode(keep_alive))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader):
        try:
            line = await asyncio.wait_for(reader.readline(), IDLE_TIMEOUT_S)
            while line in (b"\r\n", b"\n"):
                line = await reader.readline()
            if not line:
                return None
            parts = line.decode("latin-1").split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                return Response(400, b"400 Bad Request\n", "text/plain; charset=utf-8")
            method, target, version = parts
            headers: dict[str, str] = {}
            size = len(line)
            while True:
                hline = await reader.readline()
                size += len(hline)
                if size > MAX_HEADER_BYTES:
                    return Response(400, b"400 Request Header Fields Too Large\n", "text/plain; charset=utf-8")
                if hline in (b"\r\n", b"\n", b""):
                    break
                key, sep, value = hline.decode("latin-1").partition(":")
                if not sep:
                    return Response(400, b"400 Bad Request: malformed header\n", "text/plain; charset=utf-8")
                headers[key.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body = await self._read_chunked(reader)
            else:
                try:
                    length = int(headers.get("content-length", "0") or 0)
                except ValueError:
                    return Response(400, b"400 Bad Request: bad Content-Length\n", "text/plain; charset=utf-8")
                if length < 0 or length > MAX_BODY_BYTES:
                    return Response(413, b"413 Request Entity Too Large\n", "text/plain; charset=utf-8")
                body = await reader.readexactly(length) if length else b""
            return method.upper(), target, version, headers, body
        except (ValueError, asyncio.LimitOverrunError):
            return Response(400, b"400 Bad Request: line too long\n", "text/plain; charset=utf-8")

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        parts, total = [], 0
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > MAX_BODY_BYTES:
                raise ValueError("body too large")
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
