"""The connection to a running orchestrator, and what a failed call tells its user.

`Target` is where the orchestrator serves and how to reach it (TLS, bearer token);
`Target.from_options` makes one from the connection options of `rdu` (--address,
--token, --token-file, --tls-ca, --tls-server-name), naming them in its errors.
`RackCallFailed` turns a gRPC error into one line for the user and an exit code: 2 when
the request was wrong, as for a bad command-line value; 1 when the rack failed
(`one_line_errors` does it for the calls of a block).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from rdurack.api.server import channel
from rdurack.errors import RdurackError
from rdurack.security.tls import TlsConfig, tls_from

DEFAULT_ADDRESS = "127.0.0.1:50051"
RPC_TIMEOUT_S = 30.0  # a unary call to the orchestrator: it answers from its job store


@dataclass(frozen=True)
class Target:
    """The orchestrator a client talks to, and how (TLS, bearer token)."""

    address: str = DEFAULT_ADDRESS
    token: str | None = None
    tls: TlsConfig | None = None

    def channel(self) -> grpc.Channel:
        """A new channel to the orchestrator; the caller closes it (`with`)."""
        return channel(self.address, tls=self.tls, token=self.token)

    @classmethod
    def from_options(
        cls,
        address: str,
        token: str = "",
        token_file: Path | None = None,
        tls_ca: Path | None = None,
        tls_server_name: str = "",
    ) -> Target:
        """A Target from the connection options; a bad one is the user's error, said now
        (a missing token file, a missing or unreadable CA)."""
        if token and token_file is not None:
            raise RdurackError("--token and --token-file: give one of them")
        if token_file is not None:
            try:
                token = token_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as e:
                why = getattr(e, "strerror", e)
                raise RdurackError(f"--token-file {token_file}: {why}") from None
            if not token:
                raise RdurackError(f"--token-file {token_file}: the file is empty")
        if tls_server_name and tls_ca is None:
            raise RdurackError("--tls-server-name needs --tls-ca")
        tls = tls_from(tls_ca, server_name=tls_server_name or None)
        if tls is not None:
            tls.ca_pem()
        return cls(address, token or None, tls)


# gRPC codes that mean the request was wrong (exit 2), as for bad command-line values.
USER_ERRORS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


def details(e: grpc.RpcError) -> str:
    """What the server said about a failed call (the error itself when it said nothing)."""
    return (e.details() if isinstance(e, grpc.Call) else None) or str(e)


def deadline_passed(e: grpc.RpcError) -> bool:
    return isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED


class RackCallFailed(RdurackError):
    """A call to the orchestrator failed: one line for the user, and the exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def from_rpc(cls, e: grpc.RpcError, address: str) -> RackCallFailed:
        code = e.code() if isinstance(e, grpc.Call) else None
        said = (e.details() if isinstance(e, grpc.Call) else None) or str(code or e)
        if code in USER_ERRORS:
            return cls(said, 2)
        if code == grpc.StatusCode.UNAVAILABLE:
            return cls(
                f"the orchestrator at {address} is unavailable; is the rack up? run rdu up "
                "(if it serves TLS: --tls-ca)",
                1,
            )
        name = code.name if code is not None else "error"
        return cls(f"{name} from {address}: {' '.join(said.split())}", 1)


@contextmanager
def one_line_errors(address: str) -> Iterator[None]:
    """The block's gRPC failures as RackCallFailed, naming the orchestrator at `address`."""
    try:
        yield
    except grpc.RpcError as e:
        raise RackCallFailed.from_rpc(e, address) from None
