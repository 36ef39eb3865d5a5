"""The cross checks of what happens during a run: its faults, attackers (timed, against targets) and assertions.

Fault targets must name a site, replica, robot or the router of this scenario, and chaos.timeline
(where installed) parses the faults with its own grammar; attackers must target a robot and name
attacks bench.security knows; assertions must parse against the scenario's groups and replicas.
"""

from __future__ import annotations

import re

from bench.scenario import model as sm
from bench.scenario.spec import AssertionSpec, GroupSpec, ReplicaSpec, ScenarioError, Where
from wire.suggest import did_you_mean

FAULT_TARGET_RE = re.compile(r"^(robot|site|server):[^\s]+$|^router(:hub)?$")


def read_attackers(w: Where, m: sm.ScenarioFile, groups: list[GroupSpec]) -> list[dict]:
    out: list[dict] = []
    try:
        from bench.security.attacker import attacks_for
    except Exception:  # the attacker module needs zenoh; validation without it checks names only
        attacks_for = None
    for i, atk in enumerate(m.attackers):
        path = ("attackers", i)
        a = atk.model_dump()
        if any(o["name"] == a["name"] for o in out):
            raise w.fail((*path, "name"), f"attacker name {a['name']!r} is used twice")
        target = a["target"] or f"{groups[0].name}/0"
        gname, _, idx = target.partition("/")
        match = [g for g in groups if g.name == gname]
        if not match or not idx.isdigit() or int(idx) >= match[0].count:
            raise w.fail(
                (*path, "target"),
                f"{target!r} is not GROUP/INDEX of a robot; groups: "
                + ", ".join(f"{g.name} (0..{g.count - 1})" for g in groups),
            )
        a["target"] = target
        if float(a["at"]) > float(m.duration_s):
            raise w.fail((*path, "at"), f"{a['at']:g} s is after the end of the run ({m.duration_s:g} s)")
        if attacks_for is not None:
            known = attacks_for(a["credentials"])
            words = known if a["attacks"] == "all" else a["attacks"]
            if not isinstance(words, list) or not words or any(x not in known for x in words):
                raise w.fail(
                    (*path, "attacks"),
                    f"{a['attacks']!r}: give `all` or a list of attacks for credentials "
                    f"{a['credentials']}: {', '.join(known)}",
                )
            a["attacks"] = list(words)
        out.append(a)
    return out


def read_faults(w: Where, m: sm.ScenarioFile, sites, replicas, groups) -> list[dict]:
    raw = m.faults
    targets_known = {"router", "router:hub"} | {f"site:{s}" for s in sites} | {f"server:{r.id}" for r in replicas}
    for i, item in enumerate(raw):
        path = ("faults", i)
        target = item.get("target")
        if isinstance(target, str) and FAULT_TARGET_RE.match(target):
            if target.startswith("robot:"):
                _check_robot_target(w, (*path, "target"), target, groups)
            elif target not in targets_known:
                raise w.fail(
                    (*path, "target"),
                    f"unknown target {target!r}{did_you_mean(target, targets_known)}; "
                    f"known: {', '.join(sorted(targets_known))}, robot:<group>[/<index>]",
                )
        t = item.get("at", item.get("t"))
        duration = float(m.duration_s)
        if isinstance(t, (int, float)) and not isinstance(t, bool) and t > duration:
            raise ScenarioError(
                w.source, w.line(*path), f"faults[{i}].at", f"fault at {t}s is after the end of the run ({duration}s)"
            )
        if item.get("action") == "start":
            raise w.fail(
                (*path, "action"),
                f"`start` is not written as a fault: give the replica `start_at: {t if t is not None else 20}` "
                "under servers.replicas (it then starts at that time, as a fault the report shades)",
            )
        late = {f"server:{r.id}": r.start_at for r in replicas if r.start_at is not None}
        if target in late and isinstance(t, (int, float)) and t <= late[target]:
            raise w.fail(
                (*path, "at"),
                f"{target} starts at {late[target]:g} s (its start_at): a fault on it at {t:g} s finds no process",
            )
    for j, r in enumerate(replicas):
        if r.start_at is not None and r.start_at >= float(m.duration_s):
            raise w.fail(
                ("servers", "replicas", j, "start_at"),
                f"{r.start_at:g} s is not before the end of the run ({float(m.duration_s):g} s)",
            )
    _check_timeline_with_chaos(w, raw)
    starts = [
        {"at": float(r.start_at), "target": f"server:{r.id}", "action": "start"}
        for r in replicas
        if r.start_at is not None
    ]
    return [dict(item) for item in raw] + starts


def _check_robot_target(w: Where, path: tuple, target: str, groups) -> None:
    body = target.split(":", 1)[1]
    gname, _, idx = body.partition("/")
    for g in groups:
        if g.name == gname:
            if idx and (not idx.isdigit() or int(idx) >= g.count):
                raise w.fail(path, f"robot index {idx!r} is not in 0..{g.count - 1} of group {gname!r}")
            return
    raise w.fail(path, f"unknown group {gname!r} in {target!r}; groups: {', '.join(g.name for g in groups)}")


def _check_timeline_with_chaos(w: Where, raw: list) -> None:
    """Let chaos.timeline parse the faults when it is importable: its grammar is the authority."""
    try:
        from chaos import timeline
    except Exception:
        return
    parse = getattr(timeline, "parse_timeline", None) or getattr(timeline, "parse", None)
    if parse is None or not raw:
        return
    try:
        parse([dict(x) for x in raw])
    except Exception as exc:  # its error names the entry; we add the file and line
        msg = str(exc)
        m = re.search(r"\[(\d+)\]", msg)
        line = w.line("faults", int(m.group(1))) if m else w.line("faults")
        raise ScenarioError(w.source, line, "faults", msg) from None


def read_assertions(
    w: Where, m: sm.ScenarioFile, groups: list[GroupSpec], replicas: list[ReplicaSpec]
) -> list[AssertionSpec]:
    from bench.scenario import assertions as asserts

    out = []
    for i, expr in enumerate(m.assertions):
        line = w.line("assertions", i)
        try:
            asserts.check_expression(expr, groups=[g.name for g in groups], replicas=[r.id for r in replicas])
        except asserts.AssertionSyntaxError as exc:
            raise ScenarioError(w.source, line, f"assertions[{i}]", str(exc)) from None
        out.append(AssertionSpec(expression=expr, line=line))
    return out
