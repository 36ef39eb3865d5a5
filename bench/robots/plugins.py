"""Robot types from users' own packages, with no edit of bench/: entry points and `module:Class`.

    pyproject.toml of the user's package:              a scenario group:
      [project.entry-points."fleet_inference.robots"]    robot: myarm              (the entry point's name)
      myarm = "mypkg.robots:MyArm"                       robot: mypkg.robots:MyArm (no entry point needed)

Either way the class is a bench.robots.RobotType subclass (its own MJCF in `load_spec`, its task in
`reset_robot` / `evaluate` / `observe`), imported on first use and registered under the word the scenario
used, so a shard process finds it exactly as the runner did. Invariant: a name resolves to one class per
process; a plugin never replaces a registered type.
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata

from bench.robots.core import ROBOT_TYPES, TYPE_FINDERS, RobotType

ENTRY_POINT_GROUP = "fleet_inference.robots"
_MODULE_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class PluginError(ValueError):
    """A plugin robot type that cannot be loaded; the message says why and what to do."""


def entry_points() -> dict[str, str]:
    """Entry point name -> `module:Class` of every installed distribution's fleet_inference.robots."""
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def is_module_class(name: str) -> bool:
    return bool(_MODULE_CLASS.match(name))


def load_class(target: str, what: str) -> type[RobotType]:
    """The RobotType subclass `module:Class` names; PluginError saying why not."""
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise PluginError(
            f"{what}: cannot import {module!r} ({exc}); install the package that holds it (pip install -e DIR) "
            "or put its directory on PYTHONPATH"
        ) from None
    except Exception as exc:  # the user's module raised while importing: said, not a traceback through the loader
        raise PluginError(f"{what}: importing {module!r} raised {type(exc).__name__}: {exc}") from None
    cls = getattr(mod, attr, None)
    if cls is None:
        public = sorted(n for n, v in vars(mod).items() if isinstance(v, type) and issubclass(v, RobotType))
        raise PluginError(f"{what}: module {module!r} has no {attr!r}; its RobotType classes: {public or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, RobotType)):
        raise PluginError(f"{what}: {target!r} is not a bench.robots.RobotType subclass")
    return cls


def load_plugin(name: str) -> type[RobotType] | None:
    """The plugin robot type `name` (an entry point's name, or `module:Class`), registered under `name`;
    None where `name` is neither. PluginError where it is one that does not load."""
    if name in ROBOT_TYPES:
        return ROBOT_TYPES[name]
    if is_module_class(name):
        cls = load_class(name, f"robot {name!r}")
    else:
        target = entry_points().get(name)
        if target is None:
            return None
        cls = load_class(target, f"robot {name!r} (entry point {ENTRY_POINT_GROUP} {name} = {target})")
    if not cls.name or ROBOT_TYPES.get(cls.name, cls) is not cls:
        # undecorated, or a name inherited from the type it subclasses (whose compiled model that name keys):
        # its name is the scenario's word
        cls.name = name
    ROBOT_TYPES.setdefault(name, cls)
    return ROBOT_TYPES[name]


def plugin_names() -> list[str]:
    """Entry point names of robot types installed here (their classes are not imported)."""
    return sorted(entry_points())


TYPE_FINDERS.append(load_plugin)  # robot_type(name) looks here after the registry (bench.robots imports this)
