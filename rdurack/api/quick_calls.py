"""A thread pool of their own, small, for the calls a server answers at once.

gRPC's synchronous server runs every call on one thread pool, and a server-streaming
call (WatchJob) holds its thread for the stream's life, so the orchestrator's pool is
large (orchestrator_main.SERVER_WORKERS). But a large pool under many calls in flight
spreads them over as many threads, all runnable, each taking the GIL in turn: on this
2-core machine, with 64 SubmitJob calls in flight on PostgreSQL, the bare floor server
of bench_floor.py answered 1,597-1,641 calls/s on a pool of 256 threads (64 in use) and
1,900-2,170 on one of 16 or 32 (two runs each, quiet machine); a semaphore of 16 around
the handler, the threads still 64, made it slower (1,357-1,401: each wait is one more
switch). The orchestrator went from 867-970 calls/s to 1,196-1,197, its CPU a call
from 0.92-0.99 ms to 0.75 (a rack on PostgreSQL, its sockets held).

So the calls that answer from the store, never waiting on a stream or the rack, run on
a pool of QUICK_WORKERS threads, and every other call on the server's own. gRPC picks a
call's pool from its behavior's `experimental_thread_pool` attribute (grpc/_server.py
`_select_thread_pool_for_behavior`, the hook grpcio-health-checking uses for its
non-blocking Watch); `InPool` is such a behavior, and `QuickCalls` the interceptor that
hands the listed methods to it. It goes first among a server's interceptors: gRPC reads
the attribute on the behavior the outermost one returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent import futures
from typing import Any

import grpc

# Threads for the quick calls. The orchestrator above: 1,196-1,197 calls/s with 16,
# 1,164-1,179 with 32, 950-986 with 8; the floor: 1,900-2,170 with 16 or 32, 1,473-1,678
# with 8 (two runs each). A call waits on the store's round trip: too few threads leave
# the cores idle meanwhile.
QUICK_WORKERS = 16


class InPool:
    """A unary behavior that gRPC runs on `pool` rather than on the server's pool."""

    def __init__(
        self, behavior: Callable[[Any, grpc.ServicerContext], Any], pool: futures.ThreadPoolExecutor
    ) -> None:
        self.behavior = behavior
        self.experimental_thread_pool = pool  # read by gRPC's server, by this name

    def __call__(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.behavior(request, context)


class QuickCalls(grpc.ServerInterceptor):
    """Runs the unary calls of `methods` ('/package.Service/Method') on a pool of
    `workers` threads of their own; `close` shuts it down once the server has stopped.
    The handler it builds depends on the method only (security/per_method.py)."""

    def __init__(self, methods: Collection[str], workers: int = QUICK_WORKERS) -> None:
        self._methods = frozenset(methods)
        self.pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="quick")

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or details.method not in self._methods or not handler.unary_unary:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            InPool(handler.unary_unary, self.pool),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def close(self) -> None:
        self.pool.shutdown(wait=True)
