"""The site proxies' own account of the network they made (chaos.toxiproxy.fidelity): each leg's counters at
t = 0 and at the end, their difference over the measured window, and the most each proxy asked of a chunk in each
100 ms, from the driver's proxies and, under `routers: per_node`, every node's copy of them.

Invariant: a proxy that cannot say (a real Toxiproxy, an old proxy, a node gone) gives None or is left out, never
an error: the legs go unmeasured and the run goes on (the verdict's fidelity says so).
"""

from __future__ import annotations

from bench.fleet import clock as clocks
from bench.run.procset import is_local
from bench.run.state import RunState


def proxy_legs(run: RunState) -> dict | None:
    """Every site proxy's fidelity counters now (chaos.toxiproxy.fidelity); None if the proxy cannot say."""
    chaos = run.chaos
    if chaos is None or getattr(run.proxy_server, "real_toxiproxy", False):
        return None
    try:
        return {name: chaos.fidelity(f"site-{name}") for name in run.sites}
    except Exception as exc:  # an old or foreign proxy: the legs go unmeasured, the run goes on
        run.proxy_legs_error = f"the chaos proxy gave no fidelity counters: {exc}"
        return None


def proxy_asked(run: RunState) -> dict | None:
    """Every site proxy's most asked of a chunk in each 100 ms (chaos.toxiproxy.fidelity.LegStats.asked_json
    per direction) on this host's clock: a local run's, or a cluster run's with the driver's router (its robots
    cross the driver's proxies); None where the proxies cannot say, and with per_node routers
    (node_proxy_asked)."""
    chaos = run.chaos
    if (
        run.mesh is not None
        or not hasattr(chaos, "fidelity_asked")
        or getattr(run.proxy_server, "real_toxiproxy", False)
    ):
        return None
    try:
        return {name: chaos.fidelity_asked(f"site-{name}") for name in run.sites}
    except Exception:  # an old proxy: each request's hop is bounded by the whole run's most asked instead
        return None


def node_proxy_legs(run: RunState) -> dict | None:
    """A cluster run's site proxies on each node (`routers: per_node`: its robots' proxies), their fidelity
    counters now, {node id: {site: snapshot}}; None elsewhere or if they cannot say."""
    if run.mesh is None:
        return None
    try:
        out: dict[str, dict] = {}
        for site in run.sites:
            for node_id, client in run.mesh.clients_by_node(f"site-{site}").items():
                out.setdefault(node_id, {})[site] = client.fidelity(f"site-{site}")
        return out
    except Exception:  # a node gone: its robots' hops are bounded by the legs summed over the nodes instead
        return None


def node_proxy_asked(run: RunState) -> dict:
    """A cluster run's site proxies on each node, their most asked of a chunk in each 100 ms (proxy_asked) on
    that node's monotonic clock, and the node's clock offset from this runner's, ms (timed through its
    router's actor): {node id: {"offset_ms", "asked": {site: {direction: LegStats.asked_json}}}}. A node that
    cannot say is left out (its robots' hops are bounded by the run's most asked)."""
    out: dict[str, dict] = {}
    if run.mesh is None:
        return out
    by_site = {site: run.mesh.clients_by_node(f"site-{site}") for site in run.sites}
    for node_id in {n for clients in by_site.values() for n in clients}:
        router = run.mesh.router_of(node_id)
        try:
            asked = {
                site: clients[node_id].fidelity_asked(f"site-{site}")
                for site, clients in by_site.items()
                if node_id in clients
            }
            offset = clocks.settle(router.measure_clock(), is_local(router))
        except Exception:  # an old proxy, a node gone
            continue
        out[node_id] = {"offset_ms": offset.offset_s * 1e3, "asked": asked}
    return out


def window_legs(run: RunState, start: dict | None = None, end: dict | None = None) -> dict | None:
    """Each site's proxy counters over the measured window (the end's less the start's; by default the run's
    summed over the nodes, `leg_start`/`leg_end`), None when the proxies could not say (a real Toxiproxy, a run
    that never reached its end)."""
    from chaos.toxiproxy.fidelity import subtract

    if end is None:
        start, end = run.leg_start, run.leg_end
    if not end:
        return None
    return {
        site: {
            "edges_ms": snap.get("edges_ms"),
            **{d: subtract(snap[d], ((start or {}).get(site) or {}).get(d)) for d in ("upstream", "downstream")},
        }
        for site, snap in end.items()
    }
