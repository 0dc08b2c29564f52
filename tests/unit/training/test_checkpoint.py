"""Checkpoints: rank 0 writes atomically; each rank loads onto its own socket."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.checkpoint import TrainingState, latest, load, save
from rdurack.workloads.training.models import Trainable, build_model


def _state(step: int = 3) -> tuple[TrainingState, Trainable, torch.optim.Adam]:
    model = Trainable(build_model("mlp", 6, 3, seed=1, hidden=4))
    opt = torch.optim.Adam(model.trained, lr=0.01, betas=(0.8, 0.99))
    rng = np.random.default_rng(5)
    for _ in range(step):
        model.forward(rng.random((4, 6)), rng.integers(0, 3, 4))
        model.backward()
        opt.step()
    state = TrainingState(
        params=model.params,
        optimizer=opt.state_dict(),
        step=step,
        epoch=1,
        rng=dict(rng.bit_generator.state),
        device="rdu-n0-s0",
        extra={"note": "test"},
    )
    return state, model, opt


def test_only_rank_0_writes(tmp_path: Path) -> None:
    state, _, _ = _state()
    assert save(tmp_path / "ck", state, rank=1) is None
    assert not (tmp_path / "ck").exists()  # not even the directory
    written = save(tmp_path / "ck", state, rank=0)
    assert written == tmp_path / "ck" / "ckpt-00000003.pt"
    assert sorted(os.listdir(tmp_path / "ck")) == ["ckpt-00000003.pt"]  # no temp file left


def test_round_trip(tmp_path: Path) -> None:
    state, model, opt = _state()
    path = save(tmp_path, state, rank=0)
    assert path is not None
    back = load(path, device="rdu-n0-s2", map_location="rdu-n0-s2")
    assert back.device == "rdu-n0-s2" and (back.step, back.epoch) == (3, 1)
    assert back.extra == {"note": "test"}
    for name, p in model.params.items():
        assert np.array_equal(back.params[name], p) and back.params[name].dtype == np.float32
    other = torch.optim.Adam(Trainable(build_model("mlp", 6, 3, seed=9, hidden=4)).trained)
    other.load_state_dict(back.optimizer)
    assert other.param_groups[0]["betas"] == (0.8, 0.99)
    for mine, theirs in zip(opt.state.values(), other.state.values(), strict=True):
        for key, value in mine.items():
            assert torch.equal(theirs[key], value)
    rng = np.random.default_rng()
    rng.bit_generator.state = back.rng  # type: ignore[assignment]
    expected = np.random.default_rng(5)
    expected.bit_generator.state = state.rng  # type: ignore[assignment]
    assert rng.random() == expected.random()


def test_map_location_must_be_the_loading_ranks_own_socket(tmp_path: Path) -> None:
    state, _, _ = _state()
    path = save(tmp_path, state, rank=0)
    assert path is not None
    # Without map_location the tensors would land on rank 0's socket.
    with pytest.raises(
        InvalidRequest,
        match=r"without map_location would put its tensors on rdu-n0-s0.*"
        r"not on this rank's rdu-n1-s3.*map_location='rdu-n1-s3'",
    ):
        load(path, device="rdu-n1-s3")
    with pytest.raises(InvalidRequest, match=r"map_location rdu-n0-s0 is not this rank's device"):
        load(path, device="rdu-n1-s3", map_location="rdu-n0-s0")
    with pytest.raises(InvalidRequest, match="bad socket id"):
        load(path, device="cuda:0")
    assert load(path, device="rdu-n0-s0").device == "rdu-n0-s0"  # rank 0 on its own socket


def test_a_crash_mid_save_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, _, _ = _state(step=2)
    save(tmp_path, good, rank=0)
    newer, _, _ = _state(step=4)

    def crash(src: object, dst: object) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        save(tmp_path, newer, rank=0)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000002.pt"]
    assert latest(tmp_path) == tmp_path / "ckpt-00000002.pt"


def test_latest_skips_unreadable_and_temporary_files(tmp_path: Path) -> None:
    assert latest(tmp_path / "missing") is None
    assert latest(tmp_path) is None
    for step in (1, 5):
        s, _, _ = _state(step=step)
        save(tmp_path, s, rank=0)
    good = (tmp_path / "ckpt-00000005.pt").read_bytes()
    (tmp_path / "ckpt-00000009.pt").write_bytes(good[: len(good) // 2])  # truncated copy
    (tmp_path / ".ckpt-00000012.pt.tmp-1-2").write_bytes(good)
    (tmp_path / "ckpt-00000007.pt").write_bytes(b"not a checkpoint")
    assert latest(tmp_path) == tmp_path / "ckpt-00000005.pt"
    with pytest.raises(InvalidRequest, match="not a readable training checkpoint"):
        load(tmp_path / "ckpt-00000007.pt", device="rdu-n0-s0")
