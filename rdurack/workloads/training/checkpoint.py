"""Training checkpoints: rank 0 writes, every rank loads onto its own device.

A checkpoint is one `.npz` file, `ckpt-<step>.npz`, holding the model parameters, the
optimizer state, the step and epoch, the training RNG's state and the socket it was
saved from. The article's two checkpoint mistakes are handled here:

- every rank writing: `save` writes only on rank 0; on any other rank it is a no-op
  that returns None, so a script may call it on every rank (as `if rank == 0:` would);
- loading without a map_location: tensors load onto the device they were saved from
  (rank 0's socket) unless `map_location` names another, so `load` needs the loading
  rank's own socket (`device`) and refuses a `map_location` that is not it (and a
  missing one, unless the checkpoint was saved from that very socket).

Writes are atomic (a temporary file in the same directory, fsync, `os.replace`), so a
crash leaves either the previous checkpoints or a complete new one, never half a file;
`latest` also skips anything it cannot read. Arrays load with `allow_pickle=False`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rdurack.errors import InvalidRequest
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.arrays import Params
from rdurack.workloads.training.optim import StateDict

FORMAT = "rdurack-ddp-checkpoint/1"
_NAME = re.compile(r"^ckpt-(\d+)\.npz$")
_PARAM = "param/"  # npz keys: param/<name>
_OPTIM = "optim/"  # npz keys: optim/<param name>/<buffer name>
_META = "meta"  # a JSON string: step, epoch, rng, optimizer hyperparameters, device


@dataclass(slots=True)
class TrainingState:
    """What a checkpoint holds."""

    params: Params  # model parameters by name
    optimizer: StateDict  # an optimizer's state_dict()
    step: int  # optimizer steps done
    epoch: int  # the epoch that step belongs to
    rng: dict[str, Any] | None = None  # np.random.Generator.bit_generator.state
    device: str = ""  # socket the arrays are on: saved from, or map_location on load
    extra: dict[str, Any] = field(default_factory=dict)  # JSON-able user metadata


def state_bytes(state: TrainingState) -> int:
    """Bytes of the arrays a checkpoint holds: parameters and optimizer state."""
    arrays = [*state.params.values()]
    for buffers in state.optimizer.get("state", {}).values():
        arrays += [np.asarray(v) for v in buffers.values()]
    return sum(int(a.nbytes) for a in arrays)


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.npz"


def _socket(value: str | SocketId, what: str) -> str:
    try:
        return str(value if isinstance(value, SocketId) else SocketId.parse(value))
    except InvalidRequest as e:
        raise InvalidRequest(f"{what}: {e}") from None


def save(directory: str | Path, state: TrainingState, *, rank: int) -> Path | None:
    """Write `state` as `directory/ckpt-<step>.npz` if `rank` is 0; the path written, or
    None on any other rank (which writes nothing: one writer, no N-way write traffic,
    no ranks overwriting each other). `state.device` is the socket rank 0 saves from."""
    if rank != 0:
        return None
    if state.step < 0 or state.epoch < 0:
        raise InvalidRequest(
            f"checkpoint step and epoch must be >= 0, got {state.step}, {state.epoch}"
        )
    device = _socket(state.device, "checkpoint device")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {f"{_PARAM}{name}": p for name, p in state.params.items()}
    for name, buffers in state.optimizer.get("state", {}).items():
        for key, value in buffers.items():
            arrays[f"{_OPTIM}{name}/{key}"] = np.asarray(value)
    meta = {
        "format": FORMAT,
        "step": state.step,
        "epoch": state.epoch,
        "rng": state.rng,
        "device": device,
        "param_groups": state.optimizer.get("param_groups", []),
        "extra": state.extra,
    }
    arrays[_META] = np.array(json.dumps(meta))
    final = directory / checkpoint_name(state.step)
    # Same directory (os.replace is atomic only within one file system); a name that
    # `latest` ignores, unique per process and thread.
    tmp = directory / f".{final.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_directory(directory)  # the rename itself survives a crash
    return final


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(
    path: str | Path, *, device: str | SocketId, map_location: str | SocketId | None = None
) -> TrainingState:
    """Read a checkpoint onto the loading rank's own socket `device`. `map_location`
    must be that socket; without it the tensors would land where they were saved
    from, which is refused unless that is `device` (torch's every-rank-on-cuda:0)."""
    own = _socket(device, "load: device")
    path = Path(path)
    with np.load(path, allow_pickle=False) as npz:
        if _META not in npz.files:
            raise InvalidRequest(f"{path} is not a training checkpoint (no metadata)")
        meta = json.loads(str(npz[_META]))
        if meta.get("format") != FORMAT:
            raise InvalidRequest(f"{path}: unknown checkpoint format {meta.get('format')!r}")
        saved_on = str(meta["device"])
        if map_location is None:
            if saved_on != own:
                raise InvalidRequest(
                    f"loading {path.name} without map_location would put its tensors on "
                    f"{saved_on} (where rank 0 saved it), not on this rank's {own}: every "
                    f"rank would land on {saved_on}; pass map_location={own!r}"
                )
            target = own
        else:
            target = _socket(map_location, "load: map_location")
            if target != own:
                raise InvalidRequest(
                    f"map_location {target} is not this rank's device {own}: each rank "
                    f"loads onto its own socket; pass map_location={own!r}"
                )
        params: Params = {}
        optim_state: dict[str, dict[str, Any]] = {}
        for key in npz.files:
            if key.startswith(_PARAM):
                params[key[len(_PARAM) :]] = npz[key]
            elif key.startswith(_OPTIM):
                name, _, buffer = key[len(_OPTIM) :].rpartition("/")
                optim_state.setdefault(name, {})[buffer] = npz[key]
    groups = [dict(g) for g in meta["param_groups"]]
    for g in groups:  # JSON turned tuples into lists
        for k, v in g.items():
            if isinstance(v, list):
                g[k] = tuple(v)
    return TrainingState(
        params=params,
        optimizer={"state": optim_state, "param_groups": groups},
        step=int(meta["step"]),
        epoch=int(meta["epoch"]),
        rng=meta["rng"],
        device=target,
        extra=dict(meta.get("extra", {})),
    )


def _readable(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return f"{_META}.npy" in z.namelist() and z.testzip() is None
    except (OSError, zipfile.BadZipFile):
        return False


def latest(directory: str | Path) -> Path | None:
    """The checkpoint with the highest step in `directory` that reads back complete, or
    None. Temporary files of an interrupted save are never candidates."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = sorted(
        ((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))),
        reverse=True,
    )
    for _, path in found:
        if _readable(path):
            return path
    return None
