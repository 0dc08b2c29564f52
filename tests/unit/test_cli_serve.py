"""`rdu predict serve` and `rdu predict decode --speculative`, run as a real process:
their JSON, their tables and their one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdurack.traces.plots.serving import read_curves
from rdurack.workloads.serving.speculative import DRAFT_MODELS
from tests.support.cli import rdu, rdu_json

SERVE = ["predict", "serve", "--platform", "sn40l-node", "--model", "llama3.1-8b"]


def test_predict_serve_json_has_every_figure() -> None:
    out = rdu_json(*SERVE, "--sockets", "8", "--batch-size", "16", "--prompt-tokens", "1024")
    assert isinstance(out, dict)
    assert list(out) == [
        "platform", "model", "num_sockets", "batch_size", "prompt_tokens", "output_tokens",
        "plan", "prefill_plan", "ttft_s", "itl_s", "e2e_s", "tokens_per_s",
        "tokens_per_s_per_user", "hbm_bandwidth_utilization", "breakdown", "speculative",
    ]  # fmt: skip
    assert (out["num_sockets"], out["batch_size"], out["output_tokens"]) == (8, 16, 1024)
    assert set(out["breakdown"]) == {
        "prefill_s", "decode_s", "launch_s", "collective_s", "decode_iterations",
        "kernel_calls", "hbm_bytes_moved", "kv_cache_bytes", "hbm_bytes_per_socket",
    }  # fmt: skip
    assert out["e2e_s"] == pytest.approx(out["ttft_s"] + out["breakdown"]["decode_s"])
    assert out["tokens_per_s_per_user"] == pytest.approx(1 / out["itl_s"])
    assert out["speculative"] is None


def test_predict_serve_on_a_dgx_with_some_of_its_gpus_speculating() -> None:
    out = rdu_json(
        "predict", "serve", "--platform", "dgx-h100", "--sockets", "4", "--model",
        "llama3.1-70b", "--output-tokens", "128", "--speculative", "--draft-tokens", "3",
        "--acceptance", "0.6",
    )  # fmt: skip
    assert (out["num_sockets"], out["plan"], out["prefill_plan"]) == (4, "unfused", "unfused")
    spec = out["speculative"]
    assert (spec["draft_model"], spec["draft_tokens"], spec["acceptance"]) == (
        "llama3.1-8b", 3, 0.6,
    )  # fmt: skip
    assert spec["tokens_per_iteration"] == pytest.approx((1 - 0.6**4) / 0.4)


def test_predict_serve_prints_a_table_with_the_breakdown() -> None:
    done = rdu(*SERVE, "--output-tokens", "16")
    assert done.returncode == 0, done.stderr
    for row in ("ttft_s", "tokens_per_s_per_user", "breakdown.decode_s", "breakdown.launch_s"):
        assert row in done.stdout


def test_predict_decode_speculative_says_its_assumptions() -> None:
    plain = rdu_json("predict", "decode", "--platform", "sn40l-rack16", "--model", "llama3.1-405b")
    fast = rdu_json(
        "predict", "decode", "--platform", "sn40l-rack16", "--model", "llama3.1-405b",
        "--speculative",
    )  # fmt: skip
    assert fast["tokens_per_s_per_user"] > plain["tokens_per_s_per_user"]
    assert fast["draft_model"] == "llama3.1-8b" and fast["tokens_per_iteration"] > 1
    assert fast["step_s"] == pytest.approx(fast["iteration_s"] / fast["tokens_per_iteration"])


def test_the_speculative_defaults_are_in_the_help() -> None:
    done = rdu("predict", "serve", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.replace("│", " ").split())  # the help's box, unwrapped
    assert "default: the calibrated k" in text and "default: the calibrated one" in text
    for target, draft in DRAFT_MODELS.items():
        assert f"{draft} for {target}" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--platform", "dgx-a100", "--model", "llama3.1-405b"], "HBM cannot hold"),
        (["--platform", "dgx-a100", "--model", "llama3.1-8b", "--sockets", "3"], "divide heads"),
        (["--platform", "sn40l-node", "--model", "llama2-7b", "--sockets", "16"], "has 8 sockets"),
        (["--platform", "dgx-h100", "--model", "llama2-7b", "--plan", "fused-ho"], "unfused"),
        (["--platform", "sn40l-node", "--model", "falcon-40b", "--speculative"], "--draft-model"),
        (
            ["--platform", "sn40l-node", "--model", "llama2-7b", "--draft-model", "x"],
            "needs --spec",
        ),
        (["--platform", "sn40l-node", "--model", "llama2-7b", "--batch-size", "0"], "batch-size"),
        (["--platform", "sn40l-node", "--model", "gpt-9"], "unknown model 'gpt-9'"),
    ],
)
def test_bad_requests_are_one_line(args: list[str], message: str) -> None:
    done = rdu("predict", "serve", *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr


# ------------------------------------------------------------------ a stream of requests

STREAM = [*SERVE, "--sockets", "8", "--prompt-tokens", "256", "--output-tokens", "32"]


def test_predict_serve_replays_a_poisson_stream_with_percentiles_and_goodput() -> None:
    out = rdu_json(
        *STREAM, "--arrivals", "poisson", "--rate", "20", "--requests", "60",
        "--policy", "static", "--max-batch", "8", "--slo-ttft-ms", "500", "--slo-itl-ms", "40",
    )  # fmt: skip
    assert (out["policy"], out["max_batch"], out["requests"], out["refused"]) == (
        "static", 8, 60, 0,
    )  # fmt: skip
    for key in ("queue_s", "ttft_s", "itl_s", "tpot_s", "e2e_s"):
        q = out[key]
        assert 0 <= q["p50"] <= q["p90"] <= q["p99"] <= q["max"], key
    assert (out["slo_ttft_s"], out["slo_itl_s"]) == (0.5, 0.04)
    assert 0 <= out["slo_attainment"] <= 1
    assert out["output_tokens_per_s"] * out["span_s"] == pytest.approx(60 * 32)


def test_predict_serve_replays_a_trace_file_and_reports_progress(tmp_path: Path) -> None:
    trace = tmp_path / "vidur.csv"
    rows = "\n".join(f"{i / 10},{128 + i},{16}" for i in range(120))
    trace.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n{rows}\n")
    done = rdu(*SERVE, "--trace", str(trace), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["requests"], out["policy"], out["num_sockets"]) == (120, "continuous", 8)
    assert "served 50 of 120 requests" in done.stderr  # progress, apart from the JSON


def test_several_rates_make_a_study_of_the_stream() -> None:
    args = [*STREAM, "--arrivals", "poisson", "--rate", "2,50", "--requests", "40"]
    rows = rdu_json(*args, "--slo-ttft-ms", "300")["rows"]
    assert [r["requests"] for r in rows] == [40, 40]
    slow, fast = rows
    assert slow["ttft_s"]["p99"] < fast["ttft_s"]["p99"]  # at 50/s they queue
    assert slow["slo_attainment"] >= fast["slo_attainment"]
    done = rdu(*args, "--markdown")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| rate (req/s) | TTFT p50 (ms) | TTFT p99 (ms) |")
    assert [line.split(" | ")[0] for line in lines[2:4]] == ["| 2", "| 50"]
    assert "continuous batching up to 64, 40 requests." in done.stdout
    assert "rate 50/s: " not in done.stderr  # 40 requests: no progress line is due
    chunked = rdu_json(*args, "--policy", "chunked-prefill", "--chunk-tokens", "128")["rows"]
    assert [r["chunk_tokens"] for r in chunked] == [128, 128]
    assert [r["chunk_tokens"] for r in rows] == [None, None]


def test_a_study_draws_its_plot_with_the_figures_of_its_json(tmp_path: Path) -> None:
    png = tmp_path / "plots" / "rates.png"
    args = [*STREAM, "--arrivals", "poisson", "--rate", "2,50", "--requests", "40"]
    done = rdu(*args, "--json", "--plot", str(png))
    assert done.returncode == 0, done.stderr
    study = json.loads(done.stdout)  # stdout stays the study alone
    assert study["rates"] == [2.0, 50.0]
    assert f"wrote {png}" in done.stderr
    [curve] = read_curves(png)
    assert curve.label == "8 × sn40l-node, continuous"
    assert curve.rates == (2.0, 50.0)
    assert list(curve.ttft_p99_s) == [r["ttft_s"]["p99"] for r in study["rows"]]
    assert list(curve.ttft_p50_s) == [r["ttft_s"]["p50"] for r in study["rows"]]
    assert list(curve.itl_p99_s) == [r["itl_s"]["p99"] for r in study["rows"]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "3"], "need --arrivals or --trace"),
        (["--policy", "static"], "need --arrivals or --trace"),
        (["--arrivals", "poisson"], "needs --rate"),
        (["--arrivals", "poisson", "--rate", "0"], "--rate: requests per second, positive"),
        (["--arrivals", "poisson", "--rate", "2,x"], "--rate: requests per second, positive"),
        (["--trace", "x.csv", "--rate", "2"], "a trace's requests arrive when it says"),
        (["--markdown"], "it needs --arrivals"),
        (["--arrivals", "poisson", "--rate", "1", "--chunk-tokens", "64"], "chunked-prefill's"),
        (["--chunk-tokens", "64"], "need --arrivals or --trace"),
        (["--arrivals", "poisson", "--rate", "1", "--batch-size", "4"], "drop --batch-size"),
        (["--arrivals", "poisson", "--rate", "1", "--speculative"], "--speculative"),
        (["--arrivals", "poisson", "--rate", "1", "--trace", "x.csv"], "give one"),
        (["--arrivals", "poisson", "--rate", "2", "--plot", "x.png"], "two rates or more"),
        (["--trace", "x.csv", "--plot", "x.png"], "two rates or more"),
        (["--plot", "x.png"], "need --arrivals or --trace"),
        (["--trace", "/nonexistent.csv"], "cannot read it"),
        (["--arrivals", "poisson", "--rate", "1", "--prompt-tokens", "9000000"], "no request"),
    ],
)
def test_bad_streams_are_one_line(args: list[str], message: str) -> None:
    done = rdu(*SERVE, *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr
