"""How a process reads its settings: flags, else environment variables, else defaults,
into one pydantic-settings model per process; a bad value or flag is one line.

`ProcessSettings` is the base of each process's model (`orchestrator_main`,
`node_agent_main`, `ray_head`). A field `state_dir` is the flag `--state-dir` and the
variable `RDURACK_STATE_DIR`, unless the field names its own variable with `env(...)`
(`RDURACK_ORCHESTRATOR_PORT`, `RAY_ADDRESS`). A flag wins over its variable; an empty
variable counts as unset. Variable names are exact (case-sensitive), as `os.environ`
was read before. `TlsSettings` adds the TLS flags every rack server takes.

`load` parses and validates, and turns every refusal into a `SettingsRefused` whose
message is one line naming the flag or variable: `--port abc: Input should be a valid
integer, ...`, `RDURACK_NODE_INDEX=-1: Input should be greater than or equal to 0`,
`unrecognized arguments: --prot`.

Why pydantic-settings' own CLI parsing (CliApp) and not argparse: it keeps today's flag
names (kebab-case field names), puts flags before the environment, and validates both
with the same field types and bounds. Its environment source alone cannot give a field
a variable that is not `RDURACK_` + its name without also making that name a flag and
reading the bare name (`PORT`) from the environment (validation aliases serve both), so
`_Environment` reads the variable each field names, and nothing else.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    CliApp,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from rdurack.errors import RdurackError
from rdurack.security.tls import DEFAULT_RACK_IDENTITY, TlsConfig, tls_from

PREFIX = "RDURACK_"
S = TypeVar("S", bound="ProcessSettings")


class SettingsRefused(RdurackError):
    """A flag or variable a process cannot start with; the message is one line."""


def env(name: str) -> dict[str, Any]:
    """A field's `json_schema_extra` naming its variable: `Field(..., json_schema_extra=
    env("RAY_ADDRESS"))`, for a field whose variable is not `RDURACK_` + its name."""
    return {"env": name}


def variable(field: FieldInfo, name: str) -> str:
    """The environment variable of field `name`."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("env") or f"{PREFIX}{name.upper()}")


def flag(name: str) -> str:
    """The flag of field `name`: `state_dir` -> `--state-dir`."""
    return "--" + name.replace("_", "-")


class _Environment(EnvSettingsSource):
    """Each field from its one variable (`variable`), read exactly as written."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.env_vars.get(variable(field, field_name)), field_name, False


class ProcessSettings(BaseSettings):
    """The base of a process's settings (the module docstring). Like `rdurack.config.
    Config`: frozen, no unknown fields, finite numbers."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        case_sensitive=True,
        env_ignore_empty=True,  # RDURACK_SPEC= means no spec, as before
        cli_kebab_case=True,
        cli_exit_on_error=False,  # refusals reach `load`, which makes them one line
        cli_hide_none_type=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No dotenv or secrets directory: flags (CliApp puts them first), then variables.
        return (init_settings, _Environment(settings_cls))


class TlsSettings(ProcessSettings):
    """The TLS flags of a rack server: the rack CA, this process's certificate and key
    (plaintext without a CA), and the name every rack member's certificate carries."""

    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_rack_identity: str = DEFAULT_RACK_IDENTITY

    def tls(self) -> TlsConfig | None:
        """The TlsConfig these flags describe; None (plaintext) without a CA.
        InvalidRequest for a certificate without its key, or without a CA."""
        return tls_from(self.tls_ca, self.tls_cert, self.tls_key, self.tls_rack_identity)


def load(cls: type[S], argv: Sequence[str] | None = None) -> S:
    """`cls` from `argv` (default: this process's arguments) and the environment.
    `--help` prints the help and exits 0; anything refused is a SettingsRefused."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return CliApp.run(cls, cli_args=args)
    except SettingsError as e:
        raise SettingsRefused(_one_line(str(e).removeprefix("error parsing CLI: "))) from None
    except ValidationError as e:
        raise SettingsRefused("; ".join(_refusal(cls, err, args) for err in e.errors())) from None


def _refusal(cls: type[ProcessSettings], error: ErrorDetails, args: list[str]) -> str:
    """One validation error as `--flag VALUE: why` or `VARIABLE=VALUE: why`: the flag
    when it was given, else the variable that set the value."""
    name = str(error["loc"][0]) if error["loc"] else ""
    field = cls.model_fields.get(name)
    if field is None:
        return _one_line(error["msg"])
    given = error.get("input")
    flagged = any(a == flag(name) or a.startswith(flag(name) + "=") for a in args)
    if not flagged and os.environ.get(variable(field, name)):
        return _one_line(f"{variable(field, name)}={given}: {error['msg']}")
    return _one_line(f"{flag(name)} {given}: {error['msg']}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def port_range(text: str, flag: str) -> range | None:
    """ "LO-HI" as the ports LO..HI (None for ""); RdurackError naming `flag` otherwise."""
    if not text.strip():
        return None
    lo, sep, hi = text.partition("-")
    try:
        ports = range(int(lo), int(hi) + 1)
    except ValueError:
        ports = range(0)
    if not sep or not ports or ports.start < 1 or ports.stop - 1 > 65535:
        raise RdurackError(f"{flag} {text!r}: expected LO-HI, two ports with LO <= HI")
    return ports
