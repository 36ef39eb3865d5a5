"""The toxics as the admin API sees them: a toxic in a proxy's chain (`ToxicWrapper`), a create body
validated as Toxiproxy validates it (`make_toxic`), and a proxy's two chains (`ToxicCollection`), every
change applied to every open link at once."""

from __future__ import annotations

import asyncio

from chaos.toxiproxy.errors import ProxyError
from chaos.toxiproxy.toxics import REGISTRY
from chaos.toxiproxy.toxics.toxic import Toxic

UPSTREAM, DOWNSTREAM = "upstream", "downstream"
DIRECTIONS = (UPSTREAM, DOWNSTREAM)  # also the order of GET /proxies/{p}/toxics


class ToxicWrapper:
    """A toxic in a proxy's chain: name, type, stream, toxicity and the attributes object."""

    __slots__ = ("name", "type", "stream", "direction", "toxicity", "toxic")

    def __init__(self, name: str, type: str, stream: str, toxicity: float, toxic: Toxic):
        self.name, self.type, self.stream, self.toxicity, self.toxic = name, type, stream, toxicity, toxic
        self.direction = stream.lower()

    def to_json(self) -> dict:
        return {
            "attributes": self.toxic.attributes(),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
        }


class ToxicCollection:
    """A proxy's two chains of toxics; every change is applied to every open link at once."""

    def __init__(self, proxy):  # the chaos.toxiproxy.proxy.Proxy whose chains these are
        self.proxy = proxy
        self.chains: dict[str, list[ToxicWrapper]] = {d: [] for d in DIRECTIONS}

    def to_json(self) -> list[dict]:
        return [w.to_json() for d in DIRECTIONS for w in self.chains[d]]

    def find(self, name: str) -> ToxicWrapper | None:
        for d in DIRECTIONS:
            for w in self.chains[d]:
                if w.name == name:
                    return w
        return None

    def _links(self, direction: str) -> list:  # the open chaos.toxiproxy.streams.Link of that direction
        return [c.links[direction] for c in list(self.proxy.connections) if c.links]

    async def add(self, wrapper: ToxicWrapper) -> None:
        self.chains[wrapper.direction].append(wrapper)
        await _gather(link.add(wrapper) for link in self._links(wrapper.direction))

    async def update(self, wrapper: ToxicWrapper) -> None:
        await _gather(link.update(wrapper) for link in self._links(wrapper.direction))

    async def remove(self, wrapper: ToxicWrapper) -> None:
        self.chains[wrapper.direction].remove(wrapper)
        await _gather(link.remove(wrapper) for link in self._links(wrapper.direction))

    async def reset(self) -> None:
        for d in DIRECTIONS:
            while self.chains[d]:
                await self.remove(self.chains[d][0])


async def _gather(coros) -> None:
    coros = list(coros)
    if coros:
        await asyncio.gather(*coros)


# The longest name of a proxy or a toxic. Both percent-encoded (12 bytes a character at worst) in the longest route
# take 25 KiB of the API's 64 KiB request head (api.MAX_HEADER_BYTES): whatever is created can be addressed.
MAX_NAME_CHARS = 1024

FLOAT32_MAX = 3.4028234663852886e38  # Go decodes toxicity into a float32


def check_name(name: str, where: str = "") -> None:
    """400 for a name too long to be addressed in a URL later (Toxiproxy has no limit; its request head has 1 MB)."""
    if len(name) > MAX_NAME_CHARS:
        raise ProxyError(f"name too long: at most {MAX_NAME_CHARS} characters{where}", 400)


def toxicity_value(value, field: str) -> float:
    """A body's toxicity as Go decodes it into a float32; a 400 naming `field`, as Go's error does, otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= FLOAT32_MAX:
        raise ProxyError(
            f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field {field} of type float32", 400
        )
    return float(value)


def make_toxic(body: dict) -> ToxicWrapper:
    """Validate a toxic-create body the way Toxiproxy does, in its order of checks (null is absent, as in Go)."""
    defaults = {"name": "", "type": "", "stream": "downstream", "toxicity": 1.0}
    name, type_, stream, toxicity = (
        default if body.get(key) is None else body[key] for key, default in defaults.items()
    )
    for key, value in (("name", name), ("type", type_), ("stream", stream)):
        if not isinstance(value, str):
            raise ProxyError(
                f"bad request body: json: cannot unmarshal {_kind(value)} into Go struct field "
                f"ToxicWrapper.{key} of type string",
                400,
            )
    toxicity = toxicity_value(toxicity, "ToxicWrapper.toxicity")
    check_name(name)
    if stream.lower() not in DIRECTIONS:
        raise ProxyError("stream was invalid, can be either upstream or downstream", 400)
    if not name:
        name = f"{type_}_{stream}"
    cls = REGISTRY.get(type_)
    if cls is None:
        raise ProxyError("invalid toxic type", 400)
    return ToxicWrapper(name, type_, stream, toxicity, cls())


def _kind(v) -> str:
    from chaos.toxiproxy.toxics.toxic import _json_kind

    return _json_kind(v)
