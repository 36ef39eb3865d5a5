"""`ChaosClient`: our wrapper over the third-party `toxiproxy-python` client (0.1.1).

    bench / tests ──► ChaosClient ──► toxiproxy-python ──HTTP──► chaos.toxiproxy (or a real toxiproxy-server)

What the wrapper adds, and why (docs/chaos.md "Client"):
- toxiproxy-python keeps the API host and port as CLASS globals (`APIConsumer`): two servers in one
  process would talk to whichever was set last. Every call here sets them under one lock.
- The client has no call to update a toxic, and its `populate()` runs client-side; `update_toxic`
  and `populate` go to the HTTP API directly with `requests`.
- `create_proxy` returns the proxy as the server reports it, so a listen on port 0 comes back with
  the real port; `add_toxic` returns the toxic as created (the client returns None).
- A 500 from the server surfaces in toxiproxy-python as a KeyError; here it is a `ChaosError` with
  the server's message.
"""

from __future__ import annotations

import threading
from urllib.parse import urlparse

import requests

_API_LOCK = threading.RLock()


class ChaosError(RuntimeError):
    """The proxy server refused a call; the message is the server's."""


class ChaosClient:
    def __init__(self, api_url: str = "http://127.0.0.1:8474", timeout_s: float = 5.0):
        u = urlparse(api_url if "://" in api_url else f"http://{api_url}")
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 8474
        self.url = f"http://{self.host}:{self.port}"
        self.timeout_s = timeout_s
        self._http = requests.Session()

    # --- toxiproxy-python, with its globals pinned to this server ----------------------------------------

    def _tp(self):
        from toxiproxy import Toxiproxy

        t = Toxiproxy()
        t.update_api_consumer(self.host, self.port)
        return t

    def _proxy(self, name: str):
        from toxiproxy.exceptions import NotFound

        p = self._tp().get_proxy(name)
        if p is None:
            raise NotFound(f"proxy {name!r} not found")
        return p

    def version(self) -> str:
        with _API_LOCK:
            v = self._tp().version()
        return v.decode() if isinstance(v, bytes) else str(v)

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0", enabled: bool = True) -> dict:
        with _API_LOCK:
            try:
                self._tp().create(upstream=upstream, name=name, listen=listen, enabled=enabled)
            except KeyError as exc:  # toxiproxy-python's shape of a 500
                raise ChaosError(f"create proxy {name!r}: the server failed ({exc}); is {listen} free?") from None
        return self.get_proxy(name)

    def delete_proxy(self, name: str) -> None:
        with _API_LOCK:
            self._tp().destroy(self._proxy(name))

    def get_proxy(self, name: str) -> dict:
        return self._get(f"/proxies/{name}")

    def list_proxies(self) -> dict:
        return self._get("/proxies")

    def set_enabled(self, name: str, enabled: bool) -> None:
        """False is a partition: open connections close and new ones are refused; True heals it."""
        with _API_LOCK:
            p = self._proxy(name)
            p.enable() if enabled else p.disable()

    def add_toxic(
        self,
        proxy: str,
        type: str,
        attributes: dict | None = None,
        name: str | None = None,
        stream: str = "downstream",
        toxicity: float = 1.0,
    ) -> dict:
        name = name or f"{type}_{stream}"
        with _API_LOCK:
            self._proxy(proxy).add_toxic(
                type=type, attributes=dict(attributes or {}), name=name, stream=stream, toxicity=toxicity
            )
        return self._get(f"/proxies/{proxy}/toxics/{name}")

    def remove_toxic(self, proxy: str, name: str) -> None:
        with _API_LOCK:
            self._proxy(proxy).destroy_toxic(name)

    def toxics(self, proxy: str) -> list[dict]:
        return self._get(f"/proxies/{proxy}/toxics")

    def reset(self) -> None:
        with _API_LOCK:
            self._tp().reset()

    # --- what toxiproxy-python cannot do --------------------------------------------------------------------

    def update_toxic(
        self, proxy: str, name: str, attributes: dict | None = None, toxicity: float | None = None
    ) -> dict:
        body: dict = {"attributes": dict(attributes or {})}
        if toxicity is not None:
            body["toxicity"] = toxicity
        return self._call("POST", f"/proxies/{proxy}/toxics/{name}", body)

    def fidelity(self, proxy: str) -> dict:
        """Per direction, what the proxy's links applied against what their toxics asked
        (chaos.toxiproxy.fidelity; our proxy only: the real Toxiproxy answers 404)."""
        return self._get(f"/proxies/{proxy}/fidelity")

    def fidelity_asked(self, proxy: str) -> dict:
        """Per direction, the most the proxy's toxics asked of a chunk written in each 100 ms of its monotonic
        clock: {"t0_s", "bucket_s", "dropped", "asked_ms_max": [...]} (our proxy only; the last hour at least)."""
        return self._get(f"/proxies/{proxy}/fidelity/asked")

    def populate(self, proxies: list[dict]) -> list[dict]:
        return self._call("POST", "/populate", proxies)["proxies"]

    def _get(self, path: str):
        return self._call("GET", path)

    def _call(self, method: str, path: str, body=None):
        r = self._http.request(method, self.url + path, json=body, timeout=self.timeout_s)
        if r.status_code >= 400:
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            raise ChaosError(f"{method} {path}: {r.status_code} {msg}")
        return r.json() if r.content else None


class ProxyPool:
    """Several proxy servers behind one ChaosClient face: each proxy lives on the server that created it
    (dealt round-robin), and every call naming a proxy goes there. What spreads a run's sites over more
    than one proxy process (one event loop each) while its faults and figures stay written per site."""

    ROUTED = (
        "delete_proxy",
        "get_proxy",
        "set_enabled",
        "add_toxic",
        "remove_toxic",
        "toxics",
        "update_toxic",
        "fidelity",
        "fidelity_asked",
    )

    def __init__(self, clients: list[ChaosClient]):
        if not clients:
            raise ValueError("a ProxyPool needs at least one proxy server")
        self.clients = list(clients)
        self.home: dict[str, ChaosClient] = {}

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0", enabled: bool = True) -> dict:
        client = self.clients[len(self.home) % len(self.clients)]
        created = client.create_proxy(name, upstream, listen=listen, enabled=enabled)
        self.home[name] = client
        return created

    def server_of(self, name: str) -> int:
        return self.clients.index(self.home[name])

    def __getattr__(self, attr: str):
        if attr not in self.ROUTED:
            raise AttributeError(attr)

        def routed(proxy: str, *args, **kwargs):
            try:
                client = self.home[proxy]
            except KeyError:
                raise KeyError(
                    f"no proxy {proxy!r} in this pool; proxies: {', '.join(self.home) or '(none)'}"
                ) from None
            return getattr(client, attr)(proxy, *args, **kwargs)

        return routed

    def version(self) -> str:
        return self.clients[0].version()

    def list_proxies(self) -> dict:
        out: dict = {}
        for client in self.clients:
            out.update(client.list_proxies())
        return out

    def reset(self) -> None:
        for client in self.clients:
            client.reset()
