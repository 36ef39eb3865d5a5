"""The set of proxies by name: create, replace, remove, populate, reset.

Owns the integrity of the proxy set (unique names; populate validates every entry before it
creates any). Every mutation runs under one asyncio lock, so API calls that await (binding a
listener, flushing a removed toxic) never interleave with each other.
"""

from __future__ import annotations

import asyncio

from chaos.toxiproxy.proxy import AlreadyStarted, Proxy, ProxyError, check_name

PROXY_NOT_FOUND = ProxyError("proxy not found", 404)
PROXY_EXISTS = ProxyError("proxy already exists", 409)


class ProxyCollection:
    def __init__(self):
        self.proxies: dict[str, Proxy] = {}
        self.lock = asyncio.Lock()

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise PROXY_NOT_FOUND
        return proxy

    async def add(self, proxy: Proxy, start: bool) -> None:
        if proxy.name in self.proxies:
            raise PROXY_EXISTS
        if start:
            await proxy.start()
        self.proxies[proxy.name] = proxy

    async def add_or_replace(self, proxy: Proxy, start: bool) -> Proxy:
        existing = self.proxies.get(proxy.name)
        if existing is not None:
            if not await existing.differs(proxy.listen, proxy.upstream):
                return existing
            existing.stop()
        if start:
            await proxy.start()
        self.proxies[proxy.name] = proxy
        return proxy

    async def remove(self, name: str) -> None:
        proxy = self.get(name)
        proxy.stop()
        del self.proxies[name]

    async def populate(self, entries) -> tuple[list[Proxy], ProxyError | None]:
        """Toxiproxy's populate: validate all, then add-or-replace in order; stop at the first error."""
        if not isinstance(entries, list):
            return [], ProxyError(
                f"bad request body: json: cannot unmarshal {_kind(entries)} into Go value of type []toxiproxy.Proxy",
                400,
            )
        parsed = []
        for i, entry in enumerate(entries, start=1):
            if not isinstance(entry, dict):
                return [], ProxyError(
                    f"bad request body: json: cannot unmarshal {_kind(entry)} into Go value of type toxiproxy.Proxy",
                    400,
                )
            try:
                name, listen, upstream, enabled = proxy_fields(entry, {"listen": "", "enabled": True})
            except ProxyError as exc:
                return [], exc
            if not name:
                return [], ProxyError(f"missing required field: name at proxy {i}", 400)
            if not upstream:
                return [], ProxyError(f"missing required field: upstream at proxy {i}", 400)
            try:
                check_name(name, f" at proxy {i}")
            except ProxyError as exc:
                return [], exc
            parsed.append((name, listen, upstream, enabled))
        done: list[Proxy] = []
        for name, listen, upstream, enabled in parsed:
            try:
                done.append(await self.add_or_replace(Proxy(name, listen, upstream), enabled))
            except ProxyError as exc:
                return done, exc
        return done, None

    async def reset(self) -> None:
        """Re-enable every proxy and remove every toxic; delete nothing."""
        for proxy in list(self.proxies.values()):
            try:
                await proxy.start()
            except AlreadyStarted:
                pass
            await proxy.toxics.reset()

    def clear(self) -> None:
        for proxy in list(self.proxies.values()):
            proxy.stop()
        self.proxies.clear()


def proxy_fields(body: dict, defaults: dict) -> tuple[str, str, str, bool]:
    """(name, listen, upstream, enabled) from a JSON object, typed as Go's decoder would."""
    out = []
    for key, kind in (("name", str), ("listen", str), ("upstream", str), ("enabled", bool)):
        value = body.get(key)
        if value is None:
            value = defaults.get(key, "" if kind is str else False)
        if not isinstance(value, kind):
            go = "string" if kind is str else "bool"
            raise ProxyError(
                f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field "
                f"Proxy.{key} of type {go}",
                400,
            )
        out.append(value)
    return tuple(out)


def _kind(v) -> str:
    from chaos.toxiproxy.toxics.toxic import _json_kind

    return _json_kind(v)
