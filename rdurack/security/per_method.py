"""A server's interceptors, run once per method rather than once per call.

gRPC's Python server runs its interceptors for every call, on the one thread that takes
calls off the completion queue, before any handler thread sees the call: each of ours
(tracing, the quick calls' pool, the guards) builds a new handler around the one below
it. Under 64 SubmitJob calls in flight that pipeline was some 10% of the orchestrator's
interpreter time, all of it on that one thread.

None of them needs more of a call than its method: whatever depends on the call (its
metadata, its peer's certificate, its token, its request) is read from the call's
context by the handler they build, when the call runs. So `PerMethod` runs the chain
on a method's first call and hands every later call of that method the same handler.
An interceptor that decided by a call's metadata in `intercept_service` would be wrong
behind it; each of rdurack's says so where it is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc


class PerMethod(grpc.ServerInterceptor):
    """`interceptors` (outermost first), their handler for each method built on the
    method's first call and kept. A method no service has (a None handler) is not kept:
    it is asked for again, and answered UNIMPLEMENTED each time."""

    def __init__(self, interceptors: Sequence[grpc.ServerInterceptor]) -> None:
        self.interceptors = tuple(interceptors)
        # Filled on the server's call-taking thread only; a dict read is atomic anyway.
        self._handlers: dict[str, Any] = {}

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        method = details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = self._chain(0, continuation, details)
            if handler is not None:
                self._handlers[method] = handler
        return handler

    def _chain(self, i: int, continuation: Callable[[Any], Any], details: Any) -> Any:
        if i == len(self.interceptors):
            return continuation(details)
        return self.interceptors[i].intercept_service(
            lambda d: self._chain(i + 1, continuation, d), details
        )
