"""Our Toxiproxy-compatible server (the Go binary cannot be installed on these machines).

`proxy` is the listener, `streams` the data path (its docstring draws it), `chains` the toxics as
the API sees them, `toxics/` one module per toxic plus the registry, `api` the HTTP API, `collection`
the proxy set, `server` the loop that runs them all.
"""

from chaos.toxiproxy.api import TOXIPROXY_VERSION, VERSION
from chaos.toxiproxy.server import ServerThread, ToxiproxyServer, serve

__all__ = ["ServerThread", "ToxiproxyServer", "serve", "VERSION", "TOXIPROXY_VERSION"]
