"""The `rdu` command line, run as a real process: its JSON contract and its errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rdurack.cli.coe import read_trace
from rdurack.errors import InvalidRequest
from tests.support.cli import rdu, rdu_json

COE_TIMES = ("total_s", "router_s", "switch_s", "switch_s_per_expert", "expert_s")


def _positive_float(value: Any) -> bool:
    return isinstance(value, float) and value > 0 and math.isfinite(value)


# ------------------------------------------------------------------ predict coe


def test_coe_on_the_sn40l_node_serves_the_batch() -> None:
    out = rdu_json("predict", "coe", "--platform", "sn40l-node")
    assert isinstance(out, dict)
    assert out["platform"] == "sn40l-node"
    assert out["oom"] is False
    for key in COE_TIMES:
        assert _positive_float(out[key]), f"{key}={out[key]!r}"
    assert out["total_s"] >= out["router_s"]
    # Default batch of 8: every request of the batch switches in its own expert.
    assert out["switch_s"] == pytest.approx(8 * out["switch_s_per_expert"], rel=1e-9)


def test_coe_on_dgx_a100_runs_out_of_host_dram_at_150_experts() -> None:
    out = rdu_json("predict", "coe", "--platform", "dgx-a100")
    assert isinstance(out, dict)
    assert out["platform"] == "dgx-a100"
    assert out["oom"] is True
    for key in COE_TIMES:
        assert key in out
        assert out[key] is None, f"{key}={out[key]!r}"
    reason = out["oom_reason"]
    assert isinstance(reason, str)
    assert reason.strip()
    assert "host DRAM" in reason


# ------------------------------------------------------------------ predict fusion


def test_fusion_decode_on_8_sockets() -> None:
    out = rdu_json(
        "predict", "fusion", "--model", "llama2-7b", "--phase", "decode",
        "--seq", "4096", "--sockets", "8",
    )  # fmt: skip
    assert isinstance(out, dict)
    for key in ("unfused_s", "fused_so_s", "fused_s", "speedup"):
        assert _positive_float(out[key]), f"{key}={out[key]!r}"
    assert out["speedup"] == pytest.approx(out["unfused_s"] / out["fused_s"], rel=1e-9)
    assert isinstance(out["fused_kernel_calls"], int)
    assert isinstance(out["unfused_kernel_calls"], int)
    assert 0 < out["fused_kernel_calls"] < out["unfused_kernel_calls"]
    assert 0 < out["hbm_bandwidth_utilization"] <= 1
    assert out["unfused_s"] > out["fused_so_s"] > out["fused_s"]


# ------------------------------------------------------------------ predict decode


def test_decode_on_the_rack_uses_all_16_sockets_by_default() -> None:
    out = rdu_json("predict", "decode", "--platform", "sn40l-rack16", "--model", "llama3.1-70b")
    assert isinstance(out, dict)
    assert _positive_float(out["tokens_per_s_per_user"])
    assert out["sockets"] == 16


def test_kernel_looped_sn40l_decodes_faster_than_unfused_h100() -> None:
    h100 = rdu_json("predict", "decode", "--platform", "dgx-h100", "--model", "llama3.1-8b")
    sn40l = rdu_json("predict", "decode", "--platform", "sn40l-node", "--model", "llama3.1-8b")
    assert h100["sockets"] == sn40l["sockets"] == 8
    assert _positive_float(h100["tokens_per_s_per_user"])
    assert h100["tokens_per_s_per_user"] < sn40l["tokens_per_s_per_user"]


# ------------------------------------------------------------------ predict footprint


def test_footprint_of_890_experts_on_dgx_h100() -> None:
    out = rdu_json(
        "predict", "footprint", "--platform", "dgx-h100",
        "--expert-model", "llama2-7b", "--experts", "890",
    )  # fmt: skip
    assert isinstance(out, dict)
    assert isinstance(out["max_experts"], int)
    assert out["max_experts"] > 0
    assert out["nodes_needed"] == math.ceil(890 / out["max_experts"])


# ------------------------------------------------------------------ --spec what-if


def test_spec_doubling_hbm_bandwidth_speeds_up_memory_bound_decode(tmp_path: Path) -> None:
    spec = tmp_path / "twice-hbm.yaml"
    spec.write_text("node:\n  socket:\n    hbm:\n      bandwidth_bytes_per_s: 3.6e12\n")
    args = ("predict", "decode", "--platform", "sn40l-node", "--model", "llama3.1-70b")
    base = rdu_json(*args)
    twice = rdu_json(*args, "--spec", str(spec))
    assert twice["platform"] == "sn40l-node"
    assert twice["tokens_per_s_per_user"] > 1.5 * base["tokens_per_s_per_user"]


# ------------------------------------------------------------------ bad input

WHATIF = "{whatif}"  # replaced by a file with an unknown field
BAD_YAML = "{bad_yaml}"  # replaced by a file that is not YAML
SMALL_DECODE = ["predict", "decode", "--platform", "sn40l-node", "--model", "llama2-7b"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        pytest.param(
            ["predict", "decode", "--platform", "nope-9000", "--model", "llama2-7b"],
            ["nope-9000", "sn40l-node", "dgx-h100"],
            id="unknown-platform",
        ),
        pytest.param(
            ["predict", "decode", "--platform", "sn40l-node", "--model", "gpt-9"],
            ["gpt-9", "llama2-7b"],
            id="unknown-model",
        ),
        pytest.param(
            ["predict", "fusion", "--model", "llama2-7b", "--phase", "sideways"],
            ["sideways", "prefill", "decode", "train"],
            id="unknown-phase",
        ),
        pytest.param(
            ["predict", "fusion", "--model", "llama2-7b", "--phase", "decode", "--seq", "0"],
            ["--seq"],
            id="seq-zero",
        ),
        pytest.param(
            ["predict", "coe", "--platform", "sn40l-node", "--batch-size", "-1"],
            ["--batch-size"],
            id="negative-batch",
        ),
        pytest.param(
            ["predict", "fusion", "--model", "llama2-7b", "--phase", "decode", "--sockets", "32"],
            ["32", "16"],
            id="more-sockets-than-the-rack",
        ),
        pytest.param(
            ["predict", "decode", "--platform", "sn40l-node", "--model", "llama3.1-405b"],
            ["llama3.1-405b", "HBM"],
            id="model-does-not-fit",
        ),
        pytest.param(
            ["predict", "decode", "--model", "llama2-7b"],
            ["--platform"],
            id="missing-required-option",
        ),
        pytest.param(
            [*SMALL_DECODE, "--spec", WHATIF],
            ["node.socket.hbm.bandwdith_bytes_per_s"],
            id="whatif-unknown-field",
        ),
        pytest.param(
            [*SMALL_DECODE, "--spec", BAD_YAML],
            ["not valid YAML"],
            id="whatif-invalid-yaml",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_bad_value(
    tmp_path: Path, args: list[str], named: list[str]
) -> None:
    whatif = tmp_path / "typo.yaml"
    whatif.write_text("node:\n  socket:\n    hbm: {bandwdith_bytes_per_s: 3.6e12}\n")
    bad_yaml = tmp_path / "broken.yaml"
    bad_yaml.write_text("node: {socket: [\n")
    argv = [str(whatif) if a == WHATIF else str(bad_yaml) if a == BAD_YAML else a for a in args]

    r = rdu(*argv, "--json")

    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    (line,) = lines
    assert line.startswith("rdu:")
    assert line.removeprefix("rdu:").strip()
    for word in named:
        assert word in line, f"{word!r} not in {line!r}"


# ------------------------------------------------------------------ bench paper


def test_bench_paper_json_lists_the_published_figures() -> None:
    out = rdu_json("bench", "paper")
    assert isinstance(out, list)
    assert out
    for figure in out:
        assert isinstance(figure, dict)
        assert {"key", "published", "predicted", "ok", "fitted", "left_out"} <= set(figure)
        assert isinstance(figure["key"], str)
        assert isinstance(figure["ok"], bool)
        assert isinstance(figure["fitted"], bool)
    keys = [f["key"] for f in out]
    assert len(keys) == len(set(keys))
    assert {"coe_overall_b8_t20_dgx-a100", "footprint_ratio"} <= set(keys)
    # Every fitted figure carries its prediction by the fit done without it.
    assert all(f["left_out"] is not None for f in out if f["fitted"])


def test_a_bad_coe_trace_names_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt": "a"}\n\n{"arrival_s": -1, "prompt": "b"}\n')
    with pytest.raises(InvalidRequest, match=r"t\.jsonl:3: arrival_s"):
        read_trace(trace)
    trace.write_text('{"arrival_s": 0}\n')
    with pytest.raises(InvalidRequest, match="exactly one of prompt or prompt_tokens"):
        read_trace(trace)
    trace.write_text("not json\n")
    with pytest.raises(InvalidRequest, match=r"t\.jsonl:1: not JSON"):
        read_trace(trace)
    trace.write_text('{"arrival_s": 1.5, "prompt_tokens": 12, "expert": "7"}\n')
    (line,) = read_trace(trace)
    assert line.arrival_s == 1.5 and line.prompt_tokens == 12 and line.expert == "7"
    assert not line.HasField("prompt")
