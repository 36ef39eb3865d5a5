"""server.served: the Served interface is exactly what the planes use of a PolicyServer, and PolicyServer has it all."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import server.control
import server.intake
import server.replies
from server.served import Served
from server.service import PolicyServer

PLANES = (server.control, server.intake, server.replies)


def _used(module) -> set[str]:
    """The names a plane reads or calls on its server: `srv.X` and `self.srv.X`."""
    names = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id == "srv") or (
            isinstance(v, ast.Attribute) and v.attr == "srv" and isinstance(v.value, ast.Name) and v.value.id == "self"
        ):
            names.add(node.attr)
    return names


def _declared() -> set[str]:
    members = set(Served.__annotations__)
    members |= {n for n, v in vars(Served).items() if inspect.isfunction(v) and not n.startswith("_")}
    return members


def _policy_server_members() -> set[str]:
    """PolicyServer's methods and properties, and every `self.X = ...` its methods assign."""
    members = {n for n in dir(PolicyServer) if not n.startswith("__")}
    for node in ast.walk(ast.parse(inspect.getsource(PolicyServer))):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    members.add(e.attr)
    return members


def test_served_declares_exactly_what_the_planes_use_of_the_server():
    used = set().union(*(_used(m) for m in PLANES))
    assert "info" in used and "active_sessions" in used  # the scan sees both `srv.X` and `self.srv.X`
    assert used == _declared(), (
        f"used, not declared: {sorted(used - _declared())}; declared, unused: {sorted(_declared() - used)}"
    )


def test_policy_server_has_every_member_of_served():
    missing = _declared() - _policy_server_members()
    assert not missing, f"PolicyServer lacks {sorted(missing)}"


def test_the_planes_reach_no_private_member_of_the_server():
    private = sorted(n for m in PLANES for n in _used(m) if n.startswith("_"))
    assert not private, private
