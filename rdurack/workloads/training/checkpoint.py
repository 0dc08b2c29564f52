"""Training checkpoints: rank 0 writes, every rank loads onto its own device.

A checkpoint is one `torch.save` file, `ckpt-<step>.pt`, holding the model parameters,
the optimizer's `state_dict()`, the step and epoch, the training RNG's state and the
socket it was saved from. The article's two checkpoint mistakes are handled here:

- every rank writing: `save` writes only on rank 0; on any other rank it is a no-op
  that returns None, so a script may call it on every rank (as `if rank == 0:` would);
- loading without a map_location: tensors load onto the device they were saved from
  (rank 0's socket) unless `map_location` names another, so `load` needs the loading
  rank's own socket (`device`) and refuses a `map_location` that is not it (and a
  missing one, unless the checkpoint was saved from that very socket).

Writes are atomic (a temporary file in the same directory, fsync, `os.replace`), so a
crash leaves either the previous checkpoints or a complete new one, never half a file;
`latest` also skips anything it cannot read. Files load with torch's
`weights_only=True` (tensors and plain containers: no code runs on load).
"""

from __future__ import annotations

import os
import re
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rdurack.errors import InvalidRequest
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.data import Params

FORMAT = "rdurack-ddp-checkpoint/2"
_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


@dataclass(slots=True)
class TrainingState:
    """What a checkpoint holds."""

    params: Params  # model parameters by name
    optimizer: dict[str, Any]  # a torch optimizer's state_dict()
    step: int  # optimizer steps done
    epoch: int  # the epoch that step belongs to
    rng: dict[str, Any] | None = None  # np.random.Generator.bit_generator.state
    device: str = ""  # socket the arrays are on: saved from, or map_location on load
    extra: dict[str, Any] = field(default_factory=dict)  # JSON-able user metadata


def state_bytes(state: TrainingState) -> int:
    """Bytes of the arrays a checkpoint holds: parameters and optimizer state."""
    tensors = [
        v
        for buffers in state.optimizer.get("state", {}).values()
        for v in buffers.values()
        if isinstance(v, torch.Tensor)
    ]
    return sum(p.nbytes for p in state.params.values()) + sum(t.nbytes for t in tensors)


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


def _socket(value: str | SocketId, what: str) -> str:
    try:
        return str(value if isinstance(value, SocketId) else SocketId.parse(value))
    except InvalidRequest as e:
        raise InvalidRequest(f"{what}: {e}") from None


def save(directory: str | Path, state: TrainingState, *, rank: int) -> Path | None:
    """Write `state` as `directory/ckpt-<step>.pt` if `rank` is 0; the path written, or
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
    payload = {
        "format": FORMAT,
        "params": {name: torch.from_numpy(p) for name, p in state.params.items()},
        "optimizer": state.optimizer,
        "step": state.step,
        "epoch": state.epoch,
        "rng": state.rng,
        "device": device,
        "extra": state.extra,
    }
    final = directory / checkpoint_name(state.step)
    # Same directory (os.replace is atomic only within one file system); a name that
    # `latest` ignores, unique per process and thread.
    tmp = directory / f".{final.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
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
    try:
        meta = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise InvalidRequest(f"{path} is not a readable training checkpoint: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise InvalidRequest(f"{path}: unknown checkpoint format {found!r}")
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
    return TrainingState(
        params={name: t.numpy() for name, t in meta["params"].items()},
        optimizer=meta["optimizer"],
        step=int(meta["step"]),
        epoch=int(meta["epoch"]),
        rng=meta["rng"],
        device=target,
        extra=dict(meta.get("extra", {})),
    )


def _readable(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            # torch.save writes a zip archive: its pickle and tensors, complete.
            names = z.namelist()
            return any(n.endswith("/data.pkl") for n in names) and z.testzip() is None
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
