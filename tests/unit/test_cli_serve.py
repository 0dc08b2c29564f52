"""`rdu predict serve` and `rdu predict decode --speculative`, run as a real process:
their JSON, their tables and their one-line errors."""

from __future__ import annotations

import pytest

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
