"""rdurack errors as gRPC status codes: never UNKNOWN with a traceback.

bad spec or value     INVALID_ARGUMENT
unknown name or id    NOT_FOUND
does not fit          RESOURCE_EXHAUSTED (tier, asked, free in the message)
over a tenant quota   RESOURCE_EXHAUSTED (tenant, asked, quota)
wrong state, busy     FAILED_PRECONDITION
not allowed           PERMISSION_DENIED (another tenant's job)
link or socket down   UNAVAILABLE
job store unreachable UNAVAILABLE (PostgreSQL down or cut off: retry)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import grpc

from rdurack.errors import (
    InvalidRequest,
    LinkFailure,
    OutOfMemory,
    PermissionDenied,
    QuotaExceeded,
    RdurackError,
    SocketBusy,
    StoreUnavailable,
    UnknownName,
)

log = logging.getLogger(__name__)

CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (OutOfMemory, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QuotaExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (UnknownName, grpc.StatusCode.NOT_FOUND),
    (SocketBusy, grpc.StatusCode.FAILED_PRECONDITION),
    (LinkFailure, grpc.StatusCode.UNAVAILABLE),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (RdurackError, grpc.StatusCode.FAILED_PRECONDITION),
]


def status_of(error: Exception) -> grpc.StatusCode:
    for kind, code in CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


F = TypeVar("F", bound=Callable[..., Any])


def _aborted(context: grpc.ServicerContext) -> bool:
    """The method already ended the call (context.abort raises a bare Exception, after
    setting the code): its code must stand, not become INTERNAL."""
    code = getattr(context, "code", lambda: None)()  # not in the typing stubs
    return code is not None and code != grpc.StatusCode.OK


def rpc(method: F) -> F:
    """Wrap a servicer method: rdurack errors abort with their status code and message;
    anything else is INTERNAL with a one-line message (the traceback goes to the log)."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except RdurackError as e:
            context.abort(status_of(e), str(e))
        except Exception as e:  # last resort: the server must keep serving
            if _aborted(context):
                raise
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__}: {type(e).__name__}: {e}")

    return cast(F, wrapper)


def rpc_stream(method: F) -> F:
    """`rpc` for server-streaming methods: errors surface while the stream is iterated."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            yield from method(self, request, context)
        except RdurackError as e:
            context.abort(status_of(e), str(e))
        except Exception as e:
            if _aborted(context):
                raise
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__}: {type(e).__name__}: {e}")

    return cast(F, wrapper)
