"""Hostile clients of a bench run: a rogue robot and intruders, each attack judged by ground truth.

    runner ──spec──► python -m bench.security.attacker ──► attacks against the victim robot's keys and the replica
                           │                        (registry ATTACKS: one function per attack word)
                           └── attacks.jsonl: {attacker, attack, attempts, outcome, evidence}
                                 outcome: denied (refused before any effect), contained (accepted by the
                                 transport, refused or bounded by the server), breached (it worked)

Ground truth, never the attacker's hope: a subscription that receives a sample is a breach; a
reply that acknowledges is a breach; a liveliness token is judged by an independent monitor
session (its own identity, read-only presence rights) looking for a probe key only the attacker
declares; a forged observation is judged afterwards by the runner from the server's audit log
(`judge: audit_forged`: any served request of the victim with a forged sequence number is a breach).
Server crashes are the runner's to see (a replica that exits fails the run).

Invariant: every attack counts its attempts and ends with exactly one outcome line, even when the
attack itself raises (then `outcome: error`, which assertions count as not contained).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

FORGED_SEQ_BASE = 1 << 40  # forged observations use seq ids from here: no honest robot gets that far
QUERY_TIMEOUT_S = 1.0

ROGUE_ATTACKS = (
    "subscribe_other_obs",
    "publish_other_obs",
    "subscribe_other_action",
    "token_other_robot",
    "token_server",
    "open_other_session",
    "reset_other_session",
    "open_fabricated_sessions",
    "flood",
    "oversized",
    "malformed",
)
INTRUDER_ATTACKS = ("connect",)


def attacks_for(credentials: str) -> list[str]:
    return list(ROGUE_ATTACKS if credentials == "own_cert" else INTRUDER_ATTACKS)


# --- the attacker's context -----------------------------------------------------------------------


class Ctx:
    def __init__(self, spec: dict):
        self.spec = spec
        self.root = spec.get("root", "@fleet")
        from wire.keys import ReplicaKeys

        self.rk = ReplicaKeys(spec["model_id"], spec.get("revision", "main"), spec["replica_id"], self.root)
        self.victim = self.rk.client(spec["victim_task"], spec["victim_uuid"])
        self.me = self.rk.client(spec["victim_task"], spec["uuid"])
        self.z = None
        self.monitor = None
        self.sniffed_session_id: str | None = None
        self.results: list[dict] = []

    def session(self):
        if self.z is None:
            self.z = open_z(self.spec, self.spec.get("tls"))
        return self.z

    def monitor_session(self):
        if self.monitor is None:
            self.monitor = open_z(self.spec, self.spec.get("monitor_tls"))
        return self.monitor

    def query(self, key: str, body, timeout: float = QUERY_TIMEOUT_S):
        from wire import SCHEMA_VERSION, Header, MsgType, decode_message

        for reply in self.session().get(
            key, payload=body.encode(), attachment=Header(SCHEMA_VERSION, MsgType.CONTROL).pack(), timeout=timeout
        ):
            if reply.ok is not None:
                try:
                    return decode_message(reply.ok.payload.to_bytes())
                except Exception as exc:
                    return exc
        return None

    def open_body(self, uuid: str):
        from wire import SCHEMA_VERSION, SessionOpen

        sp = self.spec
        return SessionOpen(
            client_uuid=uuid,
            schema_version=SCHEMA_VERSION,
            fps=float(sp["fps"]),
            action_names=list(sp["action_names"]),
            state_dim=int(sp["state_dim"]),
            cameras={n: [sp["cam_h"], sp["cam_w"], 3] for n in sp.get("cameras", [])},
            task=sp["victim_task"],
        )

    def obs(
        self, session_id: str, seq: int, session_key: str | None = None, state=None, **extra
    ) -> tuple[bytes, bytes]:
        from wire import SCHEMA_VERSION, Header, MsgType, Observation
        from wire import auth as wauth
        from wire.images import encode_image

        sp = self.spec
        header = Header(SCHEMA_VERSION, MsgType.OBS, seq, 0, time.monotonic_ns(), 1).pack()
        imgs = {
            n: encode_image(np.zeros((sp["cam_h"], sp["cam_w"], 3), np.uint8), "jpeg", 80)
            for n in sp.get("cameras", [])
        }
        st = np.zeros(int(sp["state_dim"]), np.float32) if state is None else state
        o = Observation(session_id, st, images=imgs, **extra)
        if session_key:
            o.auth = wauth.obs_tag(session_key, session_id, header)
        return o.encode(), header


def open_z(spec: dict, tls: dict | None):
    """A Zenoh session with these credentials. The local TLS checks (wire.transport.TlsFiles.check) are
    bypassed on purpose: an intruder's certificate must be judged by the router, not by our own client."""
    import zenoh

    from wire.transport import make_config

    c = make_config("client", connect=[spec["endpoint"]], lease_ms=1000)
    if tls:
        t = {"root_ca_certificate": tls["ca"], "enable_mtls": bool(tls.get("cert"))}
        if tls.get("cert"):
            t.update(connect_certificate=tls["cert"], connect_private_key=tls["key"])
        c.insert_json5("transport/link/tls", json.dumps(t))
    return zenoh.open(c)


def outcome(ctx: Ctx, attack: str, attempts: int, result: str, evidence: str, **extra) -> None:
    ctx.results.append(
        {
            "attacker": ctx.spec["name"],
            "attack": attack,
            "attempts": attempts,
            "outcome": result,
            "evidence": evidence,
            **extra,
        }
    )


# --- the attacks (registry keyed by the scenario word) ----------------------------------------------


def _listen(ctx: Ctx, key: str, seconds: float) -> list:
    got: list = []
    sub = ctx.session().declare_subscriber(key, lambda s: got.append(s))
    time.sleep(seconds)
    sub.undeclare()
    return got


def subscribe_other_obs(ctx: Ctx) -> None:
    got = _listen(ctx, ctx.victim.obs, 3.0)
    if got:
        from wire import decode_message

        try:
            ctx.sniffed_session_id = decode_message(got[-1].payload.to_bytes()).session_id
        except Exception:
            pass
    outcome(
        ctx,
        "subscribe_other_obs",
        1,
        "breached" if got else "denied",
        f"{len(got)} of the victim's observations received in 3 s",
    )


def subscribe_other_action(ctx: Ctx) -> None:
    got = _listen(ctx, ctx.victim.action, 3.0)
    outcome(
        ctx,
        "subscribe_other_action",
        1,
        "breached" if got else "denied",
        f"{len(got)} of the victim's chunks received in 3 s",
    )


def publish_other_obs(ctx: Ctx) -> None:
    # the rogue has no key of the victim's session: its forgeries carry the victim's (sniffed) session id only
    sid = ctx.sniffed_session_id or "0123456789abcdef"
    z = ctx.session()
    n = 40
    for i in range(n):
        body, header = ctx.obs(sid, FORGED_SEQ_BASE + i, episode_start=False)
        z.put(ctx.victim.obs, body, attachment=header)
        time.sleep(0.025)
    # judged by the runner from the audit log: a served request of the victim with seq >= FORGED_SEQ_BASE
    outcome(
        ctx,
        "publish_other_obs",
        n,
        "pending",
        f"{n} forged observations (session id "
        f"{'sniffed' if ctx.sniffed_session_id else 'guessed'}) on the victim's obs key",
        judge="audit_forged",
        victim=ctx.spec["victim_uuid"],
        seq_base=FORGED_SEQ_BASE,
    )


def _token_probe(ctx: Ctx, attack: str, real_key: str, probe_key: str) -> None:
    tokens = []
    for key in (real_key, probe_key):
        tokens.append(ctx.session().liveliness().declare_token(key))
    time.sleep(1.5)
    seen = [r.ok.key_expr for r in ctx.monitor_session().liveliness().get(probe_key, timeout=2.0) if r.ok is not None]
    for t in tokens:
        t.undeclare()
    outcome(
        ctx,
        attack,
        2,
        "breached" if seen else "denied",
        f"tokens declared on {real_key} and the probe {probe_key}; the monitor saw {len(seen)} probe token(s)",
    )


def token_other_robot(ctx: Ctx) -> None:
    probe = f"{ctx.rk.prefix}/rogue-probe/{ctx.spec['victim_uuid']}/alive"
    _token_probe(ctx, "token_other_robot", ctx.victim.alive, probe)


def token_server(ctx: Ctx) -> None:
    probe = f"{ctx.root}/{ctx.rk.model_id}/{ctx.rk.revision}/rogue-replica/alive"
    _token_probe(ctx, "token_server", ctx.rk.alive, probe)


def open_other_session(ctx: Ctx) -> None:
    from wire import SessionAck

    replies = [ctx.query(k, ctx.open_body(ctx.spec["victim_uuid"])) for k in (ctx.victim.session, ctx.rk.session)]
    acked = [r for r in replies if isinstance(r, SessionAck)]
    outcome(
        ctx,
        "open_other_session",
        len(replies),
        "breached" if acked else "denied",
        "replies: " + ", ".join(_describe(r) for r in replies),
    )


def reset_other_session(ctx: Ctx) -> None:
    from wire import ResetAck
    from wire.messages import Reset

    sid = ctx.sniffed_session_id or "0123456789abcdef"
    replies = [ctx.query(ctx.victim.reset, Reset(sid, 4242 + i)) for i in range(3)]
    acked = [r for r in replies if isinstance(r, ResetAck)]
    outcome(
        ctx,
        "reset_other_session",
        len(replies),
        "breached" if acked else "denied",
        f"session id {'sniffed' if ctx.sniffed_session_id else 'guessed'}; replies: "
        + ", ".join(_describe(r) for r in replies),
    )


def open_fabricated_sessions(ctx: Ctx) -> None:
    from wire import SessionAck

    n = 5
    acked = 0
    replies = []
    for i in range(n):
        fake = f"fabricated-{i}"
        r = ctx.query(ctx.rk.client(ctx.spec["victim_task"], fake).session, ctx.open_body(fake))
        replies.append(_describe(r))
        acked += isinstance(r, SessionAck)
    outcome(
        ctx,
        "open_fabricated_sessions",
        n,
        "breached" if acked else "denied",
        f"{acked}/{n} sessions opened under uuids without a certificate; replies: {sorted(set(replies))}",
    )


def _own_session(ctx: Ctx):
    """The rogue's own, legitimate session (it is an enrolled robot): the base of the resource attacks."""
    from wire import SessionAck

    if getattr(ctx, "own_ack", None) is None:
        r = ctx.query(ctx.me.session, ctx.open_body(ctx.spec["uuid"]), timeout=3.0)
        if not isinstance(r, SessionAck):
            raise RuntimeError(f"the rogue could not open its own session: {_describe(r)}")
        ctx.own_ack = r
        ctx.inbox = []
        ctx.own_sub = ctx.session().declare_subscriber(ctx.me.action, lambda s: ctx.inbox.append(_event(s)))
        ctx.own_seq = 0
    return ctx.own_ack


def _event(sample):
    from wire import Error, decode_message, unpack_header

    try:
        h = unpack_header(sample.attachment.to_bytes())
        m = decode_message(sample.payload.to_bytes())
    except Exception:
        return ("?", None, 0)
    return ("error", m.code, h.seq_id) if isinstance(m, Error) else ("chunk", None, h.seq_id)


def _send_own(ctx: Ctx, body: bytes, header: bytes) -> None:
    ctx.session().put(ctx.me.obs, body, attachment=header)


def flood(ctx: Ctx) -> None:
    ack = _own_session(ctx)
    hz, secs = float(ctx.spec["flood_hz"]), float(ctx.spec["flood_s"])
    limit, burst = float(ctx.spec.get("rate_limit_hz") or 0), float(ctx.spec.get("rate_burst") or 0)
    start = len(ctx.inbox)
    n = int(hz * secs)
    t0 = time.monotonic()
    for i in range(n):
        ctx.own_seq += 1
        body, header = ctx.obs(ack.session_id, ctx.own_seq, session_key=ack.session_key)
        _send_own(ctx, body, header)
        delay = t0 + (i + 1) / hz - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    time.sleep(1.0)
    events = ctx.inbox[start:]
    chunks = sum(1 for e in events if e[0] == "chunk")
    limited = sum(1 for e in events if e[1] == "RATE_LIMITED")
    bound = limit * (secs + 1.0) + burst if limit > 0 else float("inf")
    ok = limit > 0 and chunks <= bound and limited > 0
    outcome(
        ctx,
        "flood",
        n,
        "contained" if ok else "breached",
        f"{n} observations at {hz:g}/s for {secs:g} s: {chunks} chunks served (bound {bound:g}), "
        f"{limited} RATE_LIMITED answers",
        served=chunks,
    )


def oversized(ctx: Ctx) -> None:
    ack = _own_session(ctx)
    big = int(ctx.spec.get("max_observation_bytes") or (1 << 20)) + 64 * 1024
    n = 3
    start = len(ctx.inbox)
    seqs = []
    for _ in range(n):
        time.sleep(1.1)  # one answer per second and reason: wait so each attempt can be answered
        ctx.own_seq += 1
        seqs.append(ctx.own_seq)
        body, header = ctx.obs(
            ack.session_id,
            ctx.own_seq,
            session_key=ack.session_key,
            tensors={"padding": np.zeros(big // 4, np.float32)},
        )
        _send_own(ctx, body, header)
    time.sleep(1.0)
    events = [e for e in ctx.inbox[start:] if e[2] in seqs]
    served = sum(1 for e in events if e[0] == "chunk")
    too_large = sum(1 for e in events if e[1] == "TOO_LARGE")
    outcome(
        ctx,
        "oversized",
        n,
        "contained" if served == 0 else "breached",
        f"{n} observations of {big} bytes: {served} served, {too_large} TOO_LARGE answers",
    )


def malformed(ctx: Ctx) -> None:
    import msgpack

    from wire import SCHEMA_VERSION, Header, MsgType

    ack = _own_session(ctx)
    start = len(ctx.inbox)
    good_header = lambda: Header(SCHEMA_VERSION, MsgType.OBS, _bump(ctx), 0, time.monotonic_ns(), 1).pack()  # noqa: E731
    cases = [
        (b"\x00garbage\xff" * 10, good_header()),
        (msgpack.packb({"kind": "observation", "session_id": ack.session_id, "state": "not a tensor"}), good_header()),
        (msgpack.packb([1, 2, 3]), good_header()),
        (ctx.obs(ack.session_id, 1, session_key=ack.session_key)[0], b"\x01\x02"),
        (
            msgpack.packb(
                {
                    "kind": "observation",
                    "session_id": ack.session_id,
                    "state": {"dtype": "float32", "shape": [1 << 30], "data": b""},
                }
            ),
            good_header(),
        ),
    ]
    for body, header in cases:
        _send_own(ctx, body, header)
        time.sleep(0.1)
    time.sleep(1.0)
    served = sum(1 for e in ctx.inbox[start:] if e[0] == "chunk")
    outcome(
        ctx,
        "malformed",
        len(cases),
        "contained" if served == 0 else "breached",
        f"{len(cases)} malformed observations (garbage, mistyped fields, a list, a bad header, a 2^30-element "
        f"tensor claim): {served} served; the replica must stay up (the runner checks)",
    )


def _bump(ctx: Ctx) -> int:
    ctx.own_seq += 1
    return ctx.own_seq


def connect(ctx: Ctx) -> None:
    """An intruder: open a session with its credentials and try discovery."""
    from wire import Status, decode_message
    from wire.keys import discovery_key

    try:
        z = open_z(ctx.spec, ctx.spec.get("tls"))
    except Exception as exc:
        return outcome(ctx, "connect", 1, "denied", f"the router refused the link: {str(exc).split(' at ')[0][:200]}")
    try:
        found = []
        for r in z.get(discovery_key(ctx.rk.model_id, ctx.rk.revision, ctx.root), timeout=2.0):
            if r.ok is not None:
                try:
                    found.append(isinstance(decode_message(r.ok.payload.to_bytes()), Status))
                except Exception:
                    pass
        outcome(ctx, "connect", 1, "breached", f"connected; discovery found {sum(found)} replica(s)")
    finally:
        z.close()


ATTACKS: dict[str, Callable[[Ctx], None]] = {
    f.__name__: f
    for f in (
        subscribe_other_obs,
        subscribe_other_action,
        publish_other_obs,
        token_other_robot,
        token_server,
        open_other_session,
        reset_other_session,
        open_fabricated_sessions,
        flood,
        oversized,
        malformed,
        connect,
    )
}


def _describe(r) -> str:
    if r is None:
        return "no reply"
    code = getattr(r, "code", None)
    return code or type(r).__name__


def run(spec: dict) -> list[dict]:
    ctx = Ctx(spec)
    for word in spec["attacks"]:
        t0 = time.monotonic()
        try:
            ATTACKS[word](ctx)
        except Exception as exc:
            outcome(ctx, word, 1, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        print(
            f"attack {word}: {ctx.results[-1]['outcome']} ({time.monotonic() - t0:.1f} s) "
            f"{ctx.results[-1]['evidence'][:300]}",
            flush=True,
        )
    for s in (ctx.z, ctx.monitor):
        try:
            if s is not None:
                s.close()
        except Exception:
            pass
    return ctx.results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.security.attacker")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    start = float(spec.get("start_unix", 0))
    if start > time.time():
        time.sleep(start - time.time())
    print(f"attacker {spec['name']} ({spec['credentials']}) starts: {', '.join(spec['attacks'])}", flush=True)
    results = run(spec)
    with open(args.out, "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print("attacker done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
