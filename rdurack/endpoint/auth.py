"""Who may call the endpoint, and which models: the rack's bearer tokens over HTTP.

The tokens file is the orchestrator's (security/auth.py: `rdu serve --tokens FILE`, or
RDURACK_TOKENS), checked by the same `Authenticator`: a presented token is hashed and
compared with every stored digest in constant time. With a tokens file:

- every route but `OPEN_PATHS` needs `Authorization: Bearer TOKEN`. Without one, or
  with one the file does not know, the answer is 401 with `WWW-Authenticate: Bearer`
  and OpenAI's body for a bad key (`invalid_request_error`, `invalid_api_key`): the
  same answer for both, as the rack gives (it reveals nothing);
- a tenant may use a model unless its `socket_quota` is below the sockets the model's
  engine occupies: the quota bounds the sockets a tenant's jobs hold at once, and a
  model served on more sockets than that is one its jobs could never run on. Else 403
  with OpenAI's body for a key without access to a model (`invalid_request_error`,
  `model_not_found`, `param` "model"). An admin, or a tenant without a quota, may use
  every model;
- `/v1/models` lists only the models the caller may use (OpenAI lists what a key may
  use); a model it may not use is 403, not 404, so a client sees why.

`/health` (the kubelet's probes) and `/metrics` (Prometheus scrapes without tokens, as
it does the orchestrator's metrics port) stay open: neither names a tenant or a prompt.

Without a tokens file everyone is the open principal (an admin of no tenant), as the
rack's local default is: every route, every model.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rdurack.endpoint.protocol import error_body
from rdurack.errors import RdurackError
from rdurack.security.auth import Authenticator, Principal

OPEN_PATHS = frozenset({"/health", "/metrics"})
UNAUTHENTICATED = (
    "a valid API key is required: send the header 'Authorization: Bearer TOKEN' with a "
    "token of the rack's tokens file"
)


class ModelForbidden(RdurackError):
    """The caller's tenant may not use a model (its socket quota is below the model's
    sockets)."""


class Gate:
    """The endpoint's access rules (the module docstring): an Authenticator, and the
    sockets each model's engine occupies."""

    def __init__(self, auth: Authenticator, sockets: Mapping[str, int]) -> None:
        self.auth = auth
        self.sockets = dict(sockets)

    @classmethod
    def open(cls) -> Gate:
        return cls(Authenticator.open(), {})

    @property
    def is_open(self) -> bool:
        return self.auth.is_open

    def notice(self) -> str:
        """One line saying who may call, for the server's start-up message."""
        if self.auth.tokens is None:
            return "no tokens: anyone who reaches it may use every model"
        n = len(self.auth.tokens.tenants)
        tenants = f"{n} tenant{'' if n == 1 else 's'}"
        return f"bearer tokens required ({tenants}); {', '.join(sorted(OPEN_PATHS))} open"

    def refusal(self, principal: Principal, model: str) -> str | None:
        """Why `principal` may not use `model`; None if it may. A model not served here
        is not refused (the app answers 404 for it)."""
        quota, needs = principal.socket_quota, self.sockets.get(model)
        if principal.admin or quota is None or needs is None or quota >= needs:
            return None
        return (
            f"tenant {principal.tenant!r} does not have access to model {model!r}: it runs "
            f"on {needs} sockets, above the tenant's socket quota of {quota}"
        )

    def may_use(self, request: Request, model: str) -> bool:
        """Whether the caller of `request` may use `model` (for `/v1/models`)."""
        return self.refusal(_principal(request), model) is None

    async def model_allowed(self, request: Request) -> None:
        """A dependency of every route: ModelForbidden when the caller may not use the
        model the request names, in the path (`/v1/models/{name}`) or the JSON body.
        FastAPI has read and parsed the body already; `request.json()` returns it."""
        if self.is_open:
            return
        model = request.path_params.get("name")
        if model is None and request.method == "POST":
            try:
                body = await request.json()
            except ValueError:
                return  # not JSON: the route answers 400 for it
            model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str):
            why = self.refusal(_principal(request), model)
            if why is not None:
                raise ModelForbidden(why)

    def install(self, app: FastAPI) -> None:
        """The token check in front of every route, and the 403 answer."""
        app.add_middleware(RequireToken, gate=self)

        @app.exception_handler(ModelForbidden)
        async def forbidden(request: Request, exc: ModelForbidden) -> JSONResponse:
            body = error_body(str(exc), "invalid_request_error", "model", "model_not_found")
            return JSONResponse(body, 403)


def _principal(request: Request) -> Principal:
    found = getattr(request.state, "principal", None)
    # Only an open path is reached without a principal, and none names a model; should
    # one ever ask, it is refused rather than let through.
    if not isinstance(found, Principal):
        raise ModelForbidden("no caller was authenticated for this route")
    return found


class RequireToken:
    """ASGI middleware: the caller's Principal in `request.state.principal`, or 401
    before the request is read (so no route, even one that forgets to ask, and no 404,
    answers an unknown caller). Like the rack's gRPC interceptor, which spares only
    health."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        found = self.gate.auth.authenticate(headers)
        if found is None and scope["path"] not in OPEN_PATHS:
            refused = JSONResponse(
                error_body(UNAUTHENTICATED, "invalid_request_error", None, "invalid_api_key"),
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await refused(scope, receive, send)
            return
        if found is not None:
            scope.setdefault("state", {})["principal"] = found
        await self.app(scope, receive, send)
