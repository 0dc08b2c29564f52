"""The models an endpoint answers to, and which engine (and expert) serves each.

A preset model is served by its own engine. A CoE bundle (workloads/serving/stream/
bundle.py) is served by one engine on its sockets under several names: the bundle's own
(the router reads the prompt and picks the expert: Samba-CoE's way), and each of its
experts' (the caller picks; nothing is routed), as SambaNova lists Samba-CoE's experts
as models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rdurack.endpoint.engine import Engine, Handle
from rdurack.errors import InvalidRequest, UnknownName


@dataclass(frozen=True, slots=True)
class Served:
    """A request on its way: the engine that runs it, its handle, its expert ("" for a
    model that is not a bundle)."""

    engine: Engine
    handle: Handle
    expert: str


class Models:
    """Model names to engines: each engine's model, and a bundle's experts."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self.engines = dict(engines)
        # name -> (engine, expert); expert None: the bundle's router picks it
        self._routes: dict[str, tuple[Engine, str | None]] = {}
        for name, engine in self.engines.items():
            bundle = engine.pricer.bundle
            self._add(name, engine, "" if bundle is None else None)
            for expert in bundle.names if bundle is not None else ():
                self._add(expert, engine, expert)

    def _add(self, name: str, engine: Engine, expert: str | None) -> None:
        if name in self._routes:
            raise InvalidRequest(f"two models are named {name!r}: a preset and an expert")
        self._routes[name] = (engine, expert)

    @property
    def names(self) -> list[str]:
        """Every model name, in the order engines and their experts were given."""
        return list(self._routes)

    def sockets(self) -> dict[str, int]:
        """The sockets each name's engine occupies (what a tenant's quota is held to)."""
        return {name: engine.pricer.sockets for name, (engine, _) in self._routes.items()}

    def engine_of(self, name: str) -> Engine:
        return self._route(name)[0]

    def submit(
        self, name: str, text: str, prompt_tokens: int, output_tokens: int, received: float
    ) -> Served:
        """Queue a request for model `name` (its prompt `text`: a bundle's router reads
        it) on its engine."""
        engine, expert = self._route(name)
        bundle = engine.pricer.bundle
        routed = expert is None
        if routed:
            assert bundle is not None  # only a bundle's own name routes
            expert = bundle.names[bundle.router.route(text)]
        handle = engine.submit(prompt_tokens, output_tokens, received, expert or "", routed)
        return Served(engine, handle, expert or "")

    def _route(self, name: str) -> tuple[Engine, str | None]:
        if name not in self._routes:
            bundles = [n for n, e in self.engines.items() if e.pricer.bundle is not None]
            experts = [f"{n}'s experts (GET /v1/models)" for n in bundles]
            raise UnknownName("model", name, sorted(self.engines) + experts)
        return self._routes[name]
