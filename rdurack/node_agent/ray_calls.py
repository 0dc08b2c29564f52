"""Waiting for Ray calls to socket actors: deadlines, and failures as RdurackErrors.

Every call a node agent makes to its actors is waited for here, with a deadline, so a
dead or wedged socket shows up as a clear error, never as a hang: `get` for one or more
calls, `gather` for the parts of a job its sockets run together (the first to fail ends
the others' waits), `answers` for the calls that may go unanswered (heartbeats, state,
aborts). An actor's own RdurackError comes through as itself; a timeout, a
dead actor or any other failure is a LinkFailure naming the node, what was being done
and, where known, the dead socket.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from rdurack.errors import LinkFailure, RdurackError

# Wall seconds a heartbeat waits for the actors' answers, and GetNode for their full
# state (tier usage) once they answered: a socket busy with a long call answers its
# heartbeat at once (its control thread) but its state only when the call returns.
HEARTBEAT_TIMEOUT_S = 1.0
STATE_TIMEOUT_S = 1.0
# Wall seconds an abort or a fault hook may take (control-thread calls: milliseconds).
CONTROL_TIMEOUT_S = 5.0


def answers(refs: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """The results of the calls `refs` (socket id -> ref, in order) that end within
    `timeout_s` wall seconds: the value, or the RayActorError of an actor that died. A
    call still running is absent; any other failure is raised."""
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    out: dict[str, Any] = {}
    for sid, ref in refs.items():
        if ref in done:
            try:
                out[sid] = ray.get(ref)
            except RayActorError as e:
                out[sid] = e
    return out


def get(
    refs: list[Any],
    what: str,
    node_index: int,
    timeout_s: float,
    socket_ids: Sequence[str] = (),
    *,
    left_s: float | None = None,
) -> list[Any]:
    """ray.get within `timeout_s` wall seconds (`left_s` of them when some have gone
    already); actor failures become RdurackErrors with their cause (naming the dead
    socket when `socket_ids`, one per ref, say which it is)."""
    try:
        return list(ray.get(refs, timeout=max(0.0, timeout_s if left_s is None else left_s)))
    except GetTimeoutError:
        raise LinkFailure(
            f"node {node_index}: {what} did not finish within {timeout_s:.0f} s"
        ) from None
    except RayTaskError as e:
        cause = e.cause if isinstance(e.cause, BaseException) else None
        if isinstance(cause, RdurackError):
            raise cause from None
        raise LinkFailure(f"node {node_index}: {what} failed: {e.cause!r}") from None
    except RayActorError as e:
        dead = [s for s, r in zip(socket_ids, refs, strict=False) if _died(r)]
        which = f"socket actor {', '.join(dead)} is" if dead else "a socket actor is"
        raise LinkFailure(f"node {node_index}: {what}: {which} dead ({type(e).__name__})") from None


def gather(
    refs: list[Any],
    what: str,
    node_index: int,
    timeout_s: float,
    socket_ids: Sequence[str],
    abort: Callable[[list[str]], None],
) -> list[Any]:
    """`get` for the parts a job's sockets run together (`socket_ids`, one per ref): the
    first to fail makes `abort` end the waits of the sockets still running (they would
    wait for its messages until their timeout), then its error is raised once all have
    returned."""
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    first: Any = None  # the first call to fail: its error is the job's
    while pending:
        ready, pending = ray.wait(
            pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
        )
        if not ready:
            break  # the deadline: get below says so
        failed = [r for r in ready if _failed(r)]
        if failed and first is None:
            first = failed[0]
        if failed and pending:
            abort([sid for sid, r in zip(socket_ids, refs, strict=True) if r in pending])
    left = max(0.0, deadline - time.monotonic())
    if first is not None:  # raises it (the others' errors only echo it)
        get([first], what, node_index, timeout_s, [socket_ids[refs.index(first)]], left_s=left)
    return get(refs, what, node_index, timeout_s, socket_ids, left_s=left)


def _died(ref: Any) -> bool:
    """A call whose actor died (it cannot answer)."""
    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except (RayTaskError, GetTimeoutError):
        return False
    return False


def _failed(ref: Any) -> bool:
    """A finished call that raised (or whose actor died)."""
    try:
        ray.get(ref, timeout=0)
    except (RayTaskError, RayActorError):
        return True
    return False
