"""What-if files: override any hardware number of a platform from YAML.

    # twice the HBM bandwidth, half the DDR, on the 16-socket rack
    base: sn40l-rack16            # optional; else the platform named on the command line
    node:
      socket:
        hbm: {bandwidth_bytes_per_s: 3.6e12}
        ddr: {capacity_bytes: 750e9}

    # four racks on a 2:1 oversubscribed spine (unset spine numbers: presets.default_spine)
    racks: 4
    spine: {oversubscription: 2}

Values are validated by the same pydantic models as the presets; each replaced number's
source becomes "what-if override (FILE)", so results say what they rest on.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from rdurack.errors import InvalidRequest
from rdurack.rack.presets import default_spine, platform
from rdurack.rack.spec import PlatformSpec


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `3.6e12` (no dot) as a string; YAML 1.2 and every user reads it as a
    number. Teach the loader the 1.2 float form; quoted strings stay strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _one_line(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())


def load_platform(name: str, spec_file: Path | None = None) -> PlatformSpec:
    """The named platform, with the overrides of `spec_file` applied when given."""
    if spec_file is None:
        return platform(name)
    try:
        raw = yaml.load(spec_file.read_text(encoding="utf-8"), Loader=_Loader)
    except OSError as e:
        raise InvalidRequest(f"cannot read what-if file {spec_file}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise InvalidRequest(
            f"{spec_file} is not UTF-8 text (byte {e.start}): a what-if file is YAML"
        ) from None
    except yaml.YAMLError as e:
        raise InvalidRequest(f"{spec_file} is not valid YAML: {_one_line(e)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{spec_file}: expected a mapping of overrides at the top level")
    overrides = dict(raw)
    base = overrides.pop("base", name)
    try:
        p = platform(str(base))
        if overrides.get("racks", 1) != 1 and p.spine is None:
            # More racks need a spine: the default's assumptions, under the file's values.
            p = p.model_copy(update={"spine": default_spine(p)})
        return p.overridden(overrides, str(spec_file))
    except ValidationError as e:
        first = e.errors()[0]
        # The file's own keys, escaped: a control character ("\x1e" is a line break to
        # str.splitlines) would break the one-line error.
        path = ".".join(str(p).encode("unicode_escape").decode() for p in first["loc"])
        raise InvalidRequest(f"{spec_file}: {path}: {first['msg']}") from None
    except ValueError as e:
        raise InvalidRequest(f"{spec_file}: {e}") from None
