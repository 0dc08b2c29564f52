"""The pictures (traces/plots/): `rdu plot` draws a job's timeline, memory, loss and
stages; `rdu bench paper --plot` the paper figure; each plot function writes a PNG, or
nothing when there is nothing to draw."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rdurack.node_agent.socket import Socket
from rdurack.rack.presets import platform
from rdurack.traces.plotdata.memory import memory_series
from rdurack.traces.plotdata.training import span_loss_points, stage_points
from rdurack.traces.plots.memory import plot_memory
from rdurack.traces.plots.paper import plot_paper
from rdurack.traces.plots.timeline import plot_timeline
from rdurack.traces.plots.training import plot_loss, plot_stages
from rdurack.traces.spans import TraceError, read_trace_dir, select_job
from rdurack.workloads.training.job import TrainingWorkload
from tests.support.traces import PAPER_FIGURES, Services, progressive_stages
from tests.unit.traces.conftest import Rdu

PNG = b"\x89PNG\r\n\x1a\n"


def _png(path: Path | None) -> bytes:
    assert path is not None and path.is_file()
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000  # a drawing, not an empty canvas
    return data


def test_rdu_plot_draws_the_timeline_and_the_memory(
    job_dir: Path, tmp_path: Path, rdu: Rdu
) -> None:
    result = tmp_path / "job.json"
    result.write_text(json.dumps({"job_id": "job-a", "losses": [2.0, 1.5, 1.2, 1.1]}))
    code, stdout, err = rdu("plot", "job-a", "--out", str(tmp_path / "png"),
                            "--trace-dir", str(job_dir), "--result", str(result))  # fmt: skip
    assert code == 0, err
    for name in ("timeline", "memory", "loss"):
        _png(tmp_path / "png" / f"job-a-{name}.png")
        assert f"job-a-{name}.png" in stdout


def test_the_timeline_needs_hardware_spans(job_dir: Path, tmp_path: Path) -> None:
    spans = [s for s in select_job(read_trace_dir(job_dir), "job-a") if not s.hardware]
    with pytest.raises(TraceError, match="no hardware spans"):
        plot_timeline(spans, "job-a", tmp_path / "t.png")
    assert plot_memory(spans, "job-a", tmp_path / "m.png") is None
    assert not (tmp_path / "m.png").exists()


def test_the_stage_figure(tmp_path: Path) -> None:
    assert plot_stages([], "j", tmp_path / "x.png") is None
    points = stage_points(progressive_stages())
    _png(plot_stages(points, "j", tmp_path / "stages.png", hbm_cap_bytes=650))


def test_rdu_plot_draws_a_training_jobs_loss_and_memory_from_its_trace_alone(
    services: Services, tmp_path: Path, rdu: Rdu
) -> None:
    """A DDP job of two ranks on real sockets, each writing its spans to its trace
    file; `rdu plot` without --result draws its loss and memory."""
    ids = ["rdu-n0-s0", "rdu-n1-s0"]
    for sid in ids:
        services.tracer(sid)  # the socket's provider, writing its trace file
    made = [Socket(sid, platform("sn40l-rack16"), timeout_s=10.0,
                   tracer_provider=services.providers[sid]) for sid in ids]  # fmt: skip
    w = TrainingWorkload(world_size=2, global_batch=32, steps=8, dataset="synthetic")
    try:
        peers = {s.name: s.address() for s in made}
        for s in made:
            s.connect(peers)
            s.reserve("job-t")
        with ThreadPoolExecutor(2) as pool:
            reports = list(pool.map(lambda s: s.train("job-t", w, ids), made))
    finally:
        for s in made:
            s.close()
    out, traces = str(tmp_path / "png"), str(services.directory)
    code, stdout, err = rdu("plot", "job-t", "--out", out, "--trace-dir", traces)
    assert code == 0, err
    for name in ("timeline", "memory", "loss", "stages"):
        _png(tmp_path / "png" / f"job-t-{name}.png")
        assert f"job-t-{name}.png" in stdout
    spans = select_job(read_trace_dir(services.directory), "job-t")
    mean = [sum(r.losses[i] for r in reports) / 2 for i in range(8)]
    points = span_loss_points(spans)
    assert [step for step, _ in points] == list(range(1, 9))
    assert [loss for _, loss in points] == pytest.approx(mean)
    series = memory_series(spans)
    assert series is not None and "rdu.train.step" in series.source
    peak = sum(r.peak_bytes["hbm"] for r in reports)  # the job's peak on each socket
    assert max(n for _, n in series.tiers["hbm"]) == peak


def test_loss_and_paper_plots(tmp_path: Path) -> None:
    assert plot_loss([], "j", tmp_path / "none.png") is None
    _png(plot_loss([(i, 2.0 * 0.9**i) for i in range(1, 50)], "j", tmp_path / "loss.png"))
    _png(plot_paper(PAPER_FIGURES, tmp_path / "paper.png"))


def test_rdu_bench_paper_plot(tmp_path: Path, rdu: Rdu) -> None:
    code, stdout, err = rdu("bench", "paper", "--json", "--plot", str(tmp_path))
    assert code == 0, err
    assert json.loads(stdout)  # stdout stays the JSON alone
    assert f"wrote {tmp_path / 'paper-figures.png'}" in err
    _png(tmp_path / "paper-figures.png")
