"""The chaos run's pure parts: its seeded plan, its workload's specs (valid on the rack
it brings up), and its report's verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdurack.devtools.chaos.plan import ChaosConfig, job_specs, plan
from rdurack.devtools.chaos.report import ChaosReport
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.faults import FaultKind
from rdurack.rack.presets import platform
from rdurack.wire import jobs as job_convert
from tests.support.fake_rack import FakeGateway


def test_a_seed_gives_one_plan_inside_the_window() -> None:
    a, b = plan(5, 2, 4, 60.0, 30), plan(5, 2, 4, 60.0, 30)
    assert a == b and a != plan(6, 2, 4, 60.0, 30)
    assert [f.at_s for f in a] == sorted(f.at_s for f in a)
    assert all(f.at_s >= 0 and f.at_s + f.lasts_s <= 60.0 for f in a)
    assert {f.kind for f in a} == set(FaultKind)  # 30 draws: every kind comes up
    for f in a:
        if f.kind in (FaultKind.DROP_LINK, FaultKind.DELAY_LINK):
            x, y = f.sockets
            assert x[-3:] == y[-3:] and x[:6] != y[:6]  # a rail between two nodes
        if f.kind is FaultKind.PARTITION:
            assert f.nodes == (0, 1)


def test_every_job_of_the_workload_is_valid_on_the_chaos_rack(tmp_path: Path) -> None:
    rack = platform("sn40l-rack16").overridden({"node": {"sockets": 4}}, "chaos: 2 x 4")
    orch = Orchestrator(JobStore(tmp_path / "j.sqlite"), FakeGateway(), rack, heartbeat_s=None)
    specs = job_specs(3, 4)
    kinds = set()
    for i in range(9):
        spec = job_convert.spec_from_proto(specs(i), rack.name)
        orch.validate(spec)  # raises for a job the rack would refuse
        kinds.add(spec.workload.kind)
    assert kinds == {"kernel", "coe_inference", "training"}
    orch.store.close()


def test_the_report_is_ok_only_when_the_store_was_read_and_nothing_was_lost_or_hung() -> None:
    report = ChaosReport(seed=1, window_s=10, submitted=2, states={"SUCCEEDED": 2})
    assert not report.ok and "unknown" in report.lines()[-1]
    report.audited = "jobs.sqlite"
    assert report.ok and report.lines()[-1].startswith("lost: 0, hanging: 0")
    report.hanging["j1"] = "RUNNING"
    assert not report.ok and "hanging: j1 RUNNING" in report.lines()[-1]


def test_the_config_refuses_a_rack_too_small_to_fail_over() -> None:
    with pytest.raises(ValueError, match="nodes"):
        ChaosConfig(nodes=1)
