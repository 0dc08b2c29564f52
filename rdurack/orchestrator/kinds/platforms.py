"""Which platform a job emulates: the rack's own, or another platform's node (a DGX)
emulated on one rack node's socket actors for the job's duration."""

from __future__ import annotations

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.presets import builtin_platforms
from rdurack.rack.spec import PlatformSpec


def job_platform(rack: PlatformSpec, name: str) -> PlatformSpec:
    """The platform a job emulates: the rack's own, or another platform's node
    (a DGX) emulated on one rack node's socket actors."""
    if name == rack.name:
        return rack
    platforms = builtin_platforms()
    if name not in platforms:
        raise UnknownName("platform", name, [rack.name, *sorted(platforms)])
    other = platforms[name]
    if other.node.sockets != rack.node.sockets:
        raise InvalidRequest(
            f"spec.platform: a {name} node has {other.node.sockets} sockets; this rack emulates "
            f"another platform's node on one of its {rack.node.sockets}-socket nodes"
        )
    return other
