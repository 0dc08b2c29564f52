"""A torchrun-style script run by a socket (no Ray: a Socket object, as its actor would
run it): what the rank sees (torchrun's environment, argv, the shared folder), its log,
its errors, and the process left as it was. One rank: torch keeps one default process
group per process, so ranks of one job need processes of their own (the actors);
tests/integration/test_scripts.py runs 16."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.node_agent.socket import Socket
from rdurack.node_agent.training.script import ScriptFailed
from rdurack.rack.presets import platform
from rdurack.telemetry import names
from rdurack.workloads.training.job import RankReport, TrainingWorkload, log_path, work_dir

RACK = platform("sn40l-rack16")
GROUP = ["rdu-n1-s2"]
EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "ddp_script.py"


@pytest.fixture
def sockets() -> Iterator[list[Socket]]:
    made = [Socket(sid, RACK, timeout_s=10.0) for sid in GROUP]
    peers = {s.name: s.address() for s in made}
    try:
        for s in made:
            s.connect(peers)
        yield made
    finally:
        for s in made:
            s.close()


def train(sockets: list[Socket], job: str, w: TrainingWorkload, job_dir: Path) -> list[object]:
    """Every socket's rank of `job`; each one's report, or the error it raised."""
    for s in sockets:
        s.reserve(job)

    def rank(s: Socket) -> object:
        try:
            return s.train(job, w, GROUP, checkpoint_dir=str(job_dir))  # 0 steps: to the end
        except Exception as e:  # the test looks at each rank's outcome
            return e
        finally:
            s.release(job)

    return [rank(s) for s in sockets]


def script(source: str | bytes, *args: str) -> TrainingWorkload:
    text = source if isinstance(source, bytes) else source.encode()
    return TrainingWorkload(
        world_size=len(GROUP), global_batch=len(GROUP), script=text,
        script_name="train.py", script_args=args, wall_timeout_s=20.0,
    )  # fmt: skip


def test_the_example_trains_like_one_process_on_the_full_batch(
    sockets: list[Socket], tmp_path: Path
) -> None:
    w = script(EXAMPLE.read_bytes(), "--epochs", "4", "--lr", "0.1")
    reports = train(sockets, "job-script", w, tmp_path)
    assert all(isinstance(r, RankReport) and r.finished for r in reports), reports
    final = torch.load(work_dir(tmp_path) / "final.pt")
    # One process, the whole dataset a step, the same model and seed.
    example = runpy.run_path(str(EXAMPLE))
    data, net = example["dataset"](), example["model"]()
    x, y = data.tensors
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
    for name, p in net.state_dict().items():
        rel = (final[name] - p).norm() / p.norm()
        assert rel <= 1e-5, (name, float(rel))
    log = log_path(tmp_path, 0).read_text()
    assert "epoch 3 local rank 0 loss" in log  # the rank's stdout, kept


def test_the_rank_sees_what_torchrun_gives_and_the_process_is_restored(
    sockets: list[Socket], tmp_path: Path
) -> None:
    source = (
        "import os, sys\n"
        "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR']\n"
        "print(*[os.environ[k] for k in keys], sys.argv, os.path.basename(os.getcwd()))\n"
        "print(__name__, __file__.endswith('train.py'), file=sys.stderr)\n"
        "open('left.txt', 'w').write('x')\n"
    )
    cwd, argv, stdout, main = os.getcwd(), list(sys.argv), sys.stdout, sys.modules["__main__"]
    (report,) = train(sockets, "job-env", script(source, "--x", "two words"), tmp_path)
    assert isinstance(report, RankReport) and report.finished
    out = log_path(tmp_path, 0).read_text().splitlines()
    assert out[0] == "0 1 0 1 127.0.0.1 ['train.py', '--x', 'two words'] work"
    assert out[1] == "__main__ True"
    assert (work_dir(tmp_path) / "left.txt").read_text() == "x"
    assert os.getcwd() == cwd and sys.argv == argv and "RANK" not in os.environ
    assert sys.modules["__main__"] is main and sys.stdout is stdout


@pytest.mark.parametrize(
    ("end", "detail"),
    [
        ("raise ValueError('bad shard')", "ValueError: bad shard"),
        ("sys.exit(3)", "train.py exited with code 3"),
    ],
)
def test_a_rank_that_fails_names_itself_and_why(
    sockets: list[Socket], tmp_path: Path, end: str, detail: str
) -> None:
    source = f"import sys, torch.distributed as dist\ndist.init_process_group('rdu')\n{end}\n"
    (failed,) = train(sockets, "job-fails", script(source), tmp_path)
    assert isinstance(failed, ScriptFailed), failed
    assert "rank 0 (rdu-n1-s2) failed" in str(failed) and detail in str(failed)
    if "raise" in end:
        assert 'train.py", line 3' in str(failed)  # the script's own line
        assert "ValueError: bad shard" in log_path(tmp_path, 0).read_text()
    import torch.distributed as dist

    assert not dist.is_initialized()  # the next job in this process starts clean


def test_exit_zero_is_success(sockets: list[Socket], tmp_path: Path) -> None:
    (report,) = train(sockets, "job-exit", script("import sys\nsys.exit(0)\n"), tmp_path)
    assert isinstance(report, RankReport) and report.finished


def test_a_scripts_steps_are_traced_in_the_segments_that_saw_them(
    spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    provider, exporter = spans
    (s,) = [Socket(sid, RACK, timeout_s=10.0, tracer_provider=provider) for sid in GROUP]
    s.connect({s.name: s.address()})
    w = script(EXAMPLE.read_bytes(), "--epochs", "2")
    reports: list[RankReport] = []
    try:
        s.reserve("job-spans")
        while not (reports and reports[-1].finished):  # a step a call, as the orchestrator
            reports.append(s.train("job-spans", w, GROUP, steps=1, checkpoint_dir=str(tmp_path)))
        s.release("job-spans")
    finally:
        s.close()
    done = exporter.get_finished_spans()
    steps = sorted((x for x in done if x.name == names.SPAN_TRAIN_STEP), key=_step)
    total = reports[-1].step
    assert total > 1 and [_step(x) for x in steps] == list(range(1, total + 1))
    segments = [x for x in done if x.name == names.SPAN_TRAIN]
    assert len(segments) == len(reports)
    assert sum(_int(x, names.ATTR_STEPS) for x in segments) == total
    ids = {x.context.span_id for x in segments if x.context is not None}
    assert all(x.parent is not None and x.parent.span_id in ids for x in steps)


def _int(span: ReadableSpan, attribute: str) -> int:
    value = (span.attributes or {})[attribute]
    assert isinstance(value, int)
    return value


def _step(span: ReadableSpan) -> int:
    return _int(span, names.ATTR_STEP)
