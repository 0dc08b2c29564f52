"""Progressive training (ProFL), without Ray: the movement metric, the stages, the
block split, freezing, and what each stage holds on the memory tiers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.rack.memory import TieredMemory
from rdurack.rack.presets import platform
from rdurack.rack.spec import Tier
from rdurack.workloads.training.backend import ThreadGroup
from rdurack.workloads.training.job import TrainingWorkload
from rdurack.workloads.training.loop import train, train_threaded
from rdurack.workloads.training.memory import MemoryAccount
from rdurack.workloads.training.models import Trainable, build_split, views
from rdurack.workloads.training.profl import (
    largest_shrunken,
    parameters,
    shrunken_candidates,
)
from rdurack.workloads.training.progressive import (
    EffectiveMovement,
    Stage,
    placement,
    stage_order,
)
from rdurack.workloads.training.rank import RankContext, StageEvent, TrainSpec
from rdurack.workloads.training.scaling import built_in_plan
from rdurack.workloads.training.strategy import plan_memory

RACK = platform("sn40l-rack16")
SOCKET = RACK.socket
# The default configuration of docs/training.md, on 4 ranks.
DEFAULT = {"blocks": 4, "hidden": 64, "world_size": 4, "global_batch": 64}


# ------------------------------------------------------------------ the movement metric


def _moved(updates: list[float], window: int, threshold: float = 0.45) -> EffectiveMovement:
    p = {"w": np.zeros(3)}
    m = EffectiveMovement(p, window=window, threshold=threshold)
    for u in updates:
        p["w"] += u
        m.update()
    return m


def test_steps_the_same_way_move_fully_and_steps_that_cancel_do_not() -> None:
    assert _moved([0.1] * 10, 10).last == pytest.approx(1.0)
    assert _moved([0.1, -0.1] * 5, 10).last == pytest.approx(0.0, abs=1e-12)
    # |1 - 0.5 + 1| / (1 + 0.5 + 1): the formula, on every scalar alike.
    assert _moved([1.0, -0.5, 1.0], 3).last == pytest.approx(1.5 / 2.5)
    # Parameters that did not move count as converged (0), not as undefined.
    assert _moved([0.0] * 4, 4).last == 0.0


def test_one_value_per_window_and_freezing_below_the_threshold() -> None:
    p = {"w": np.zeros(2)}
    m = EffectiveMovement(p, window=4, threshold=0.3)
    values = []
    for k in range(12):
        p["w"] += 0.1 if k < 4 else 0.1 * (-1) ** k  # drift, then oscillation
        values.append(m.update())
    assert [v is not None for v in values] == [False, False, False, True] * 3
    assert m.history[0] == pytest.approx(1.0) and not m.converged(m.history[0])
    assert m.history[-1] < 0.3 and m.converged(m.history[-1])
    assert not m.converged(None)  # mid-window: no decision


def test_a_random_walk_moves_about_one_over_root_window() -> None:
    rng = np.random.default_rng(0)
    m = _moved(list(rng.standard_normal(100 * 64)), 64)
    assert np.mean(m.history) == pytest.approx(64**-0.5 * 1.0, rel=0.25)


def test_the_metric_follows_a_bounded_sample_of_a_large_block() -> None:
    big = {"weight": np.zeros((100, 100)), "bias": np.zeros(100)}
    m = EffectiveMovement(big, sample=256)
    assert m.sampled == 256
    assert m.nbytes == 256 * (3 * 8 + 8)  # three float64 values and an index each
    small = EffectiveMovement({"b": np.zeros(10)}, sample=256)
    assert small.sampled == 10  # all of a small block


@pytest.mark.parametrize(
    ("window", "threshold"), [(1, 0.5), (10, 0.0), (10, 1.0)], ids=["window", "zero", "one"]
)
def test_bad_metric_settings_are_refused(window: int, threshold: float) -> None:
    with pytest.raises(InvalidRequest):
        EffectiveMovement({"w": np.zeros(2)}, window=window, threshold=threshold)


# ------------------------------------------------------------------ stages and placement


def test_shrinking_runs_back_to_front_then_growing_front_to_back() -> None:
    assert stage_order("full", 4) == [Stage("full")]
    assert [s.name for s in stage_order("progressive", 3)] == [
        "shrink block 2",
        "shrink block 1",
        "shrink block 0",
        "grow block 0",
        "grow block 1",
        "grow block 2",
    ]
    with pytest.raises(InvalidRequest, match=">= 2 blocks"):
        stage_order("progressive", 1)


def test_placement_keeps_grown_blocks_in_hbm_and_the_rest_in_ddr() -> None:
    hbm, ddr = Tier.HBM, Tier.DDR
    # Growing block 1 of 3: blocks 0 (frozen) and 1 in HBM, block 2 waits in DDR;
    # block 0's output module is gone, the classifier (output.2) waits.
    assert placement(Stage("grow", 1), 3) == {
        "block.0": hbm,
        "block.1": hbm,
        "output.1": hbm,
        "block.2": ddr,
        "output.2": ddr,
    }
    # Shrinking block 1: block 2 and its output module (trained) are kept in DDR,
    # block 0's output module (not trained yet) too.
    assert placement(Stage("shrink", 1), 3) == {
        "block.0": hbm,
        "output.0": ddr,
        "block.1": hbm,
        "output.1": hbm,
        "block.2": ddr,
        "output.2": ddr,
    }


# ------------------------------------------------------------------ the block split


def _params(split: nn.Module, module: nn.Module) -> dict[str, np.ndarray]:
    return views(split, list(module.parameters()))


def test_a_stage_model_trains_its_block_and_output_module_only() -> None:
    split = build_split(64, 16, 10, blocks=3, seed=1).double()
    stage = split.stage(2)
    assert list(stage.params) == ["layers.2.weight", "layers.2.bias", "layers.3.weight",
                                  "layers.3.bias"]  # fmt: skip
    assert list(stage.grads) == list(stage.params)  # frozen blocks keep no gradients
    assert set(stage.frozen) == {f"layers.{i}.{p}" for i in (0, 1) for p in ("weight", "bias")}
    x = np.random.default_rng(0).standard_normal((5, 64))
    y = np.array([0, 1, 2, 3, 4])
    stage.forward(x, y)
    # Kept for backward: the block's input and output and the log-probabilities (float64),
    # the labels (int64) and cross-entropy's total weight (a scalar); nothing of the
    # frozen blocks.
    assert stage.saved_bytes() == 5 * (16 + 16 + 10) * 8 + 5 * 8 + 8
    stage.backward()
    assert stage.saved_bytes() == 0
    # The last block's output module is the MLP's classifier: the grown model is the MLP.
    with torch.no_grad():
        mlp = split(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(stage.logits(x), mlp)
    assert list(split.stage(0).params)[2:] == ["outputs.0.weight", "outputs.0.bias"]


# ------------------------------------------------------------------ training and freezing


def _small(**fields: object) -> TrainSpec:
    base: dict[str, object] = {
        "strategy": "progressive",
        "blocks": 3,
        "hidden": 16,
        "world_size": 1,
        "global_batch": 64,
        "steps": 40,
        "freeze_window": 10,
    }
    return TrainSpec.model_validate(base | fields)


def test_stages_end_by_the_metric_or_the_budget_and_frozen_blocks_stay_put() -> None:
    spec = _small(freeze_threshold=0.6)
    events: list[StageEvent] = []
    models: list[Trainable] = []
    frozen_at: dict[str, np.ndarray] = {}

    def seen(event: StageEvent) -> None:
        events.append(event)
        if event.stage == Stage("grow", 0) and event.report is not None:
            frozen_at.update({k: v.copy() for k, v in models[-1].params.items()})

    class Untimed:
        def forward(self) -> None: ...

        def backward(self) -> None: ...

    def timing(model: Trainable) -> Untimed:
        models.append(model)  # each stage's
        return Untimed()

    result = ThreadGroup(1, 30).run(
        lambda b: train(RankContext(b, 0, "rdu-n0-s0", timing=timing, on_stage=seen), spec)
    )[0]
    order = [s.name for s in stage_order("progressive", 3)]
    assert [(e.stage.name, e.report is not None) for e in events] == [
        (name, ended) for name in order for ended in (False, True)
    ]
    reports = result.stages
    assert [r.name for r in reports] == order
    assert sum(r.steps for r in reports) == result.steps == len(result.losses)
    for r in reports:
        assert 0 < r.steps <= 40 and r.test_accuracy is not None
        if r.converged:  # frozen at the end of a window below the threshold
            assert r.steps % 10 == 0 and r.movement is not None and r.movement < 0.6
            assert r.frozen_at_step == r.start_step + r.steps
        else:
            assert r.steps == 40 and r.frozen_at_step is None
    assert any(r.converged for r in reports) and not all(r.converged for r in reports)
    # Block 0 ends the run as its growing stage froze it; blocks 1 and 2 trained on.
    for name in ("layers.0.weight", "layers.0.bias"):
        np.testing.assert_array_equal(result.params[name], frozen_at[name], err_msg=name)
    # The grown model is the last stage's: the MLP with its classifier.
    assert result.test_accuracy == reports[-1].test_accuracy


def test_a_frozen_block_is_left_alone_by_later_stages() -> None:
    """Training block 1 and block 2 never touches block 0's arrays."""
    split = build_split(64, 16, 10, blocks=3, seed=0)
    before = {k: v.copy() for k, v in _params(split, split.block(0)).items()}
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    y = np.arange(8) % 10
    for i in (1, 2):
        model = split.stage(i)
        opt = torch.optim.SGD(model.trained, lr=0.5, momentum=0.9)
        for _ in range(5):
            model.forward(x, y)
            model.backward()
            opt.step()
        assert len(opt.state) == len(model.params)  # no optimizer state for frozen blocks
    for name, value in _params(split, split.block(0)).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


@pytest.mark.parametrize("world", [2, 4])
def test_progressive_ranks_train_exactly_as_one_process(world: int) -> None:
    """torch's DDP over the stages: each stage's model is wrapped and its gradients averaged,
    so N ranks end where one process on the global batch does."""
    single = train_threaded(_small(steps=12))[0]
    ranks = train_threaded(_small(steps=12, world_size=world))
    for r in ranks:
        assert [s.steps for s in r.stages] == [s.steps for s in single.stages]
        for name, value in single.params.items():
            np.testing.assert_allclose(r.params[name], value, rtol=1e-5, atol=1e-5)
    assert all(r.diagnostics == [] for r in ranks)


def test_progressive_training_runs_on_16_ranks() -> None:
    results = train_threaded(_small(steps=3, world_size=16, global_batch=64))
    assert len(results) == 16 and all(r.steps == 18 for r in results)
    assert {tuple(r.peak_bytes.items()) for r in results} == {tuple(results[0].peak_bytes.items())}


# ------------------------------------------------------------------ memory


def test_frozen_blocks_keep_no_gradients_optimizer_state_or_activations() -> None:
    spec = TrainSpec(strategy="progressive", epochs=1, **DEFAULT)
    plan = plan_memory(spec, SOCKET)
    split = build_split(64, 64, 10, 4, seed=0)
    local, f32 = 16, 4

    def nbytes(module: nn.Module) -> int:
        return sum(p.nbytes for p in _params(split, module).values())

    for sp in plan.stages:
        assert sp.stage.block is not None
        i = sp.stage.block
        trained = nbytes(split.block(i)) + nbytes(split.output(i))
        parts = {part: n for part, (_, n) in sp.parts.items()}
        assert parts["gradients"] == trained  # of the block and its output module only
        assert parts["optimizer"] == trained  # SGD's momentum, the same
        width_in = 64  # block 0 reads 64 pixels, later blocks 64 hidden units
        # The block's input and output, the log-probabilities; the labels (int64) and
        # cross-entropy's total weight (a scalar). Nothing of the frozen blocks.
        assert parts["activations"] == local * (width_in + 64 + 10) * f32 + local * 8 + f32
        assert parts["movement"] == 256 * 32
        # Weights: blocks 0..i in HBM, the rest in DDR.
        in_hbm = [p for p, (t, _) in sp.parts.items() if t == Tier.HBM and p.startswith("block.")]
        assert sorted(in_hbm) == [f"block.{j}" for j in range(i + 1)]
        assert sp.peak_bytes["hbm"] == sum(n for t, n in sp.parts.values() if t == Tier.HBM)
    full = plan_memory(spec.model_copy(update={"strategy": "full"}), SOCKET)
    (only,) = full.stages
    whole = sum(p.nbytes for p in split.layers.parameters())
    assert only.hbm_parts() == {
        "weights": whole,
        "gradients": whole,
        "optimizer": whole,
        # Every layer's input, the log-probabilities, the labels, the total weight.
        "activations": local * (64 + 4 * 64 + 10) * f32 + local * 8 + f32,
        "movement": 0,
    }
    # The acceptance's memory figure, from the plans: at least 40% less HBM.
    assert plan.peak(Tier.HBM) <= 0.6 * full.peak(Tier.HBM)


def test_the_run_accounts_on_the_tiers_what_the_plan_said() -> None:
    spec = TrainSpec(strategy="progressive", steps=4, **DEFAULT)
    plan = plan_memory(spec, SOCKET)
    result = train_threaded(spec)[0]
    assert [r.peak_bytes for r in result.stages] == [s.peak_bytes for s in plan.stages]
    assert result.peak_bytes["hbm"] == plan.peak(Tier.HBM)
    assert result.peak_bytes["ddr"] == plan.peak(Tier.DDR) > 0


def test_an_hbm_cap_fails_an_allocation_with_tier_asked_and_free() -> None:
    spec = TrainSpec(strategy="full", steps=2, **DEFAULT)
    need = plan_memory(spec, SOCKET).peak(Tier.HBM)
    with pytest.raises(OutOfMemory) as err:
        train_threaded(spec, hbm_cap_bytes=need - 1)
    assert err.value.tier == "hbm" and "HBM cap of" in err.value.what
    assert err.value.asked_bytes > err.value.free_bytes >= 0
    (ok,) = train_threaded(spec.model_copy(update={"world_size": 1}), hbm_cap_bytes=10**9)
    assert ok.peak_bytes["hbm"] > 0


def test_the_account_frees_before_it_allocates_and_moves_take_copy_time() -> None:
    memory = TieredMemory("rdu-n0-s0", SOCKET)
    account = MemoryAccount(memory, "job/train/", hbm_cap_bytes=1000)
    account.place({"block.0": (Tier.HBM, 600), "block.1": (Tier.DDR, 600)})
    account.begin_stage()
    # block.0's 600 HBM bytes leave before block.1's arrive: under a 1000-byte cap.
    seconds = account.place({"block.0": (Tier.DDR, 600), "block.1": (Tier.HBM, 600)})
    assert seconds == pytest.approx(2 * memory.copy_time_s(600, Tier.HBM, Tier.DDR))
    assert account.end_stage()["hbm"] == 600
    assert memory.get("job/train/block.1").tier == Tier.HBM
    with pytest.raises(OutOfMemory, match="HBM cannot hold 500 bytes"):
        account.hold("gradients", Tier.HBM, 500)
    account.close()
    assert memory.allocations() == []


# ------------------------------------------------------------------ the shrunken baseline


def test_the_largest_shrunken_model_that_fits_is_chosen_from_depth_and_width() -> None:
    w = TrainingWorkload(epochs=30, hbm_cap_bytes=128_000, **DEFAULT)
    grown = w.model_copy(update={"strategy": "progressive", "epochs": 5})
    assert (
        built_in_plan(grown, RACK).peak(Tier.HBM) <= 128_000 < built_in_plan(w, RACK).peak(Tier.HBM)
    )
    best = largest_shrunken(w, RACK)
    assert best.workload.strategy == "full" and best.workload.epochs == 30
    assert best.peak_hbm_bytes <= 128_000
    assert best.parameters == parameters(best.workload) < parameters(w)
    # Of the two families, the one with more parameters.
    assert {c.family for c in shrunken_candidates(w, RACK)} == {"depth", "width"}
    assert best.parameters == max(c.parameters for c in shrunken_candidates(w, RACK))
    # One unit wider (or one block deeper) does not fit any more.
    if best.family == "width":
        wider = best.workload.model_copy(update={"hidden": best.workload.hidden + 1})
    else:
        wider = best.workload.model_copy(update={"blocks": best.workload.blocks + 1})
    assert built_in_plan(wider, RACK).peak(Tier.HBM) > 128_000
    tiny = w.model_copy(update={"hbm_cap_bytes": 1_000})
    with pytest.raises(InvalidRequest, match="no shrunken mlp"):
        largest_shrunken(tiny, RACK)


# ------------------------------------------------------------------ the spec


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"model": "transformer", "blocks": 1}, "mlp with blocks >= 2"),
        ({"blocks": 1}, "mlp with blocks >= 2"),
        ({"checkpoint_every": 5}, "does not checkpoint"),
        ({"loop": b"x"}, "built-in loop"),
    ],
    ids=["transformer", "one-block", "checkpoints", "client-loop"],
)
def test_what_progressive_training_cannot_do_is_refused(
    fields: dict[str, object], match: str
) -> None:
    base: dict[str, object] = {"strategy": "progressive", "blocks": 4}
    with pytest.raises(ValidationError, match=match):
        TrainingWorkload.model_validate(base | fields)
    with pytest.raises(ValidationError, match="only the mlp takes blocks"):
        TrainingWorkload(model="transformer", blocks=2)


def test_the_comparison_runs_full_progressive_and_the_shrunken_model() -> None:
    from rdurack.workloads.training.profl import DEFAULT, HBM_CAP_BYTES, compare, progressive

    # The default configuration's cap sits between the two strategies' planned peaks.
    assert (
        built_in_plan(progressive(), RACK).peak(Tier.HBM)
        <= HBM_CAP_BYTES
        < built_in_plan(DEFAULT, RACK).peak(Tier.HBM)
    )
    small = TrainingWorkload(
        blocks=3, hidden=16, world_size=2, global_batch=32, steps=4, dataset="synthetic"
    )
    cap = built_in_plan(small.model_copy(update={"strategy": "progressive"}), RACK).peak(Tier.HBM)
    c = compare(small, cap=cap, seed=1)
    assert c.full.workload.hbm_cap_bytes == 0 and c.full.peak_hbm_bytes > cap
    assert c.progressive.peak_hbm_bytes <= cap and c.progressive.workload.seed == 1
    assert c.shrunken.workload == c.baseline.workload and c.shrunken.peak_hbm_bytes <= cap
    assert c.hbm_reduction == 1 - c.progressive.peak_hbm_bytes / c.full.peak_hbm_bytes > 0
    assert c.accuracy_gap == c.full.test_accuracy - c.progressive.test_accuracy
