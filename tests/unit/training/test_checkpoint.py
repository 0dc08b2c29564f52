"""Checkpoints: rank 0 writes atomically; each rank loads onto its own socket."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.checkpoint import TrainingState, latest, load, save
from rdurack.workloads.training.models import MLP
from rdurack.workloads.training.optim import Adam


def _state(step: int = 3) -> tuple[TrainingState, MLP, Adam]:
    model = MLP([6, 4, 3], seed=1)
    opt = Adam(model.params, lr=0.01, betas=(0.8, 0.99))
    rng = np.random.default_rng(5)
    for _ in range(step):
        model.forward(rng.random((4, 6)), rng.integers(0, 3, 4))
        model.backward()
        opt.step(model.grads)
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
    assert written == tmp_path / "ck" / "ckpt-00000003.npz"
    assert sorted(os.listdir(tmp_path / "ck")) == ["ckpt-00000003.npz"]  # no temp file left


def test_round_trip(tmp_path: Path) -> None:
    state, model, opt = _state()
    path = save(tmp_path, state, rank=0)
    assert path is not None
    back = load(path, device="rdu-n0-s2", map_location="rdu-n0-s2")
    assert back.device == "rdu-n0-s2" and (back.step, back.epoch) == (3, 1)
    assert back.extra == {"note": "test"}
    for name, p in model.params.items():
        assert np.array_equal(back.params[name], p) and back.params[name].dtype == np.float32
    other = Adam(MLP([6, 4, 3], seed=9).params, lr=0.5)
    other.load_state_dict(back.optimizer)
    assert other.defaults == opt.defaults
    for name, buffers in opt.state.items():
        for key, value in buffers.items():
            assert np.array_equal(other.state[name][key], value)
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
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000002.npz"]
    assert latest(tmp_path) == tmp_path / "ckpt-00000002.npz"


def test_latest_skips_unreadable_and_temporary_files(tmp_path: Path) -> None:
    assert latest(tmp_path / "missing") is None
    assert latest(tmp_path) is None
    for step in (1, 5):
        s, _, _ = _state(step=step)
        save(tmp_path, s, rank=0)
    good = (tmp_path / "ckpt-00000005.npz").read_bytes()
    (tmp_path / "ckpt-00000009.npz").write_bytes(good[: len(good) // 2])  # truncated copy
    (tmp_path / ".ckpt-00000012.npz.tmp-1-2").write_bytes(good)
    assert latest(tmp_path) == tmp_path / "ckpt-00000005.npz"
