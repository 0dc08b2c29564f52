"""A stream of requests: when each arrives and how many tokens it reads and writes.

Two sources:
- `poisson`: N requests at a mean rate, exponential gaps from a seeded generator, every
  request the same prompt and output lengths;
- `read_trace`: a file of arrivals in a format users already have, told apart by its
  first line:
  - Vidur's CSV, with the header `arrived_at,num_prefill_tokens,num_decode_tokens`
    (arrival in seconds; other columns ignored);
  - LLMServingSim's JSONL, one object a line with `input_toks`, `output_toks` and
    `arrival_time_ns` (token ids, if present, ignored).
  A bad line is refused with its number and what is wrong with it.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rdurack.errors import InvalidRequest

VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
SERVINGSIM_FIELDS = ("input_toks", "output_toks", "arrival_time_ns")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request: its index in the stream, its arrival (emulated s), its lengths; of
    a CoE bundle (serving/stream/bundle.py), its expert, and whether the router chose it
    (its prompt's prefill on the router is priced)."""

    index: int
    at_s: float
    prompt_tokens: int
    output_tokens: int
    expert: str = ""  # "": the model's only weights
    routed: bool = False


def poisson(
    rate_per_s: float, requests: int, prompt_tokens: int, output_tokens: int, seed: int = 0
) -> list[Arrival]:
    """`requests` arrivals of a Poisson process of `rate_per_s`, the first at its first
    exponential gap after 0."""
    if not rate_per_s > 0:
        raise InvalidRequest(f"rate must be positive requests per second, got {rate_per_s}")
    if requests <= 0:
        raise InvalidRequest(f"requests must be positive, got {requests}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, requests)
    times = np.cumsum(gaps)
    return _checked((i, float(t), prompt_tokens, output_tokens) for i, t in enumerate(times))


def read_trace(path: Path) -> list[Arrival]:
    """The arrivals of a Vidur CSV or an LLMServingSim JSONL file, in arrival order."""
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidRequest(f"trace {path}: cannot read it ({e.strerror})") from None
    first = text.lstrip().split("\n", 1)[0]
    if first.startswith("{"):
        return _checked(_servingsim(path, text))
    if VIDUR_COLUMNS[0] in first.replace(" ", "").split(","):
        return _checked(_vidur(path, text))
    raise InvalidRequest(
        f"trace {path}: not a Vidur CSV (header {','.join(VIDUR_COLUMNS)}) nor an "
        f"LLMServingSim JSONL (objects with {', '.join(SERVINGSIM_FIELDS)})"
    )


def _vidur(path: Path, text: str) -> Iterable[tuple[int, float, int, int]]:
    rows = csv.DictReader(line.replace(" ", "") for line in text.splitlines())
    missing = set(VIDUR_COLUMNS) - set(rows.fieldnames or ())
    if missing:
        raise InvalidRequest(f"trace {path}: the CSV header lacks {', '.join(sorted(missing))}")
    for n, row in enumerate(rows):
        line = n + 2  # the header is line 1
        yield (
            n,
            _number(path, line, "arrived_at", row["arrived_at"], float),
            _number(path, line, "num_prefill_tokens", row["num_prefill_tokens"], int),
            _number(path, line, "num_decode_tokens", row["num_decode_tokens"], int),
        )


def _servingsim(path: Path, text: str) -> Iterable[tuple[int, float, int, int]]:
    n = 0
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"trace {path} line {line}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not set(SERVINGSIM_FIELDS) <= set(obj):
            raise InvalidRequest(
                f"trace {path} line {line}: needs the fields {', '.join(SERVINGSIM_FIELDS)}"
            )
        ns = _number(path, line, "arrival_time_ns", obj["arrival_time_ns"], int)
        yield (
            n,
            ns * 1e-9,
            _number(path, line, "input_toks", obj["input_toks"], int),
            _number(path, line, "output_toks", obj["output_toks"], int),
        )
        n += 1


def _number(path: Path, line: int, name: str, value: Any, kind: type[Any]) -> Any:
    try:
        number = kind(value)
        if kind is int and isinstance(value, str | float) and float(value) != number:
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidRequest(
            f"trace {path} line {line}: {name} must be a{'n integer' if kind is int else ' number'}"
            f", got {value!r}"
        ) from None
    return number


def _checked(rows: Iterable[tuple[int, float, int, int]]) -> list[Arrival]:
    """The rows as arrivals sorted by time (a stable sort: ties keep the file's order),
    every length positive and every time finite and not negative."""
    out = []
    for index, at, prompt, output in rows:
        if not (np.isfinite(at) and at >= 0):
            raise InvalidRequest(f"request {index}: arrival must be a time >= 0 s, got {at}")
        if prompt <= 0 or output <= 0:
            raise InvalidRequest(
                f"request {index}: prompt and output tokens must be positive, got {prompt} "
                f"and {output}"
            )
        out.append(Arrival(index, at, prompt, output))
    if not out:
        raise InvalidRequest("the stream has no requests")
    return sorted(out, key=lambda a: a.at_s)
