"""CoE router: tokens, the expert catalog, routing, and the routing policies."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.workloads.coe.catalog import CATALOG_SIZE, expert_description, expert_names
from rdurack.workloads.coe.router import (
    FEATURES,
    Router,
    RoutingPolicy,
    detokenize,
    features,
    hash_route,
    route_requests,
    tokenize,
)

ROOT = Path(__file__).resolve().parents[2]

# (prompt, the expert it must reach, or a domain prefix "domain-" for any of its experts)
DOMAIN_PROMPTS = [
    ("fix this python function that throws a KeyError", "coding-python"),
    ("translate this sentence into French", "translation-french"),
    ("Translate 'good morning' into German please", "translation-german"),
    ("my rust code fails the borrow checker", "coding-rust"),
    ("write a SQL query to join two tables", "coding-sql"),
    ("solve the quadratic equation x^2 - 5x + 6 = 0", "math-algebra"),
    ("what is the derivative of x^2 sin x", "math-calculus"),
    ("is this contract clause enforceable if the other party breached it", "law-contracts"),
    ("my landlord wants to evict me before the lease ends", "law-real-estate"),
    ("I have chest pain and high blood pressure, should I see a doctor?", "medicine-cardiology"),
    ("write a haiku about autumn", "writing-poetry"),
    ("how do I make sourdough bread rise better", "cooking-"),
    ("my kubernetes pod keeps crashing with CrashLoopBackOff", "devops-kubernetes"),
    ("explain how black holes form", "science-astronomy"),
    ("what should I invest in for retirement, a 401k or an IRA?", "finance-retirement"),
    ("who won the battle of Hastings in 1066", "history-"),
    ("what is a good chess opening for beginners", "sports-chess"),
    ("what chords are in the key of C major", "music-theory"),
]


@pytest.fixture(scope="module")
def router() -> Router:
    return Router.for_catalog(CATALOG_SIZE)


# ------------------------------------------------------------------ tokens


def test_tokens_are_utf8_bytes_and_round_trip() -> None:
    assert tokenize("Hi") == [72, 105]
    assert tokenize("é") == [0xC3, 0xA9]
    text = "naïve café — 日本語"
    assert detokenize(tokenize(text)) == text
    # A cut multi-byte character decodes as U+FFFD instead of failing.
    assert detokenize(tokenize("é")[:1]) == "\ufffd"


def test_detokenize_refuses_ids_outside_the_byte_vocabulary() -> None:
    with pytest.raises(InvalidRequest, match=r"\[0, 256\): got \[256\]"):
        detokenize([65, 256])


# ------------------------------------------------------------------ catalog


def test_the_catalog_has_150_distinct_readable_stable_names() -> None:
    names = expert_names(CATALOG_SIZE)
    assert len(set(names)) == CATALOG_SIZE == 150
    assert names[:5] == [
        "coding-python",
        "math-algebra",
        "law-contracts",
        "medicine-cardiology",
        "translation-french",
    ]
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)+", n) for n in names)
    assert expert_names(10) == names[:10]  # a small bundle is a prefix of a large one
    assert expert_names(0) == []


def test_beyond_the_table_names_get_a_numeric_suffix() -> None:
    names = expert_names(2 * CATALOG_SIZE + 1)
    assert len(set(names)) == len(names)
    assert names[CATALOG_SIZE : CATALOG_SIZE + 2] == ["coding-python-2", "math-algebra-2"]
    assert names[-1] == "coding-python-3"
    assert expert_description("coding-python-3") == expert_description("coding-python")


def test_every_expert_has_a_description_and_unknown_names_are_refused() -> None:
    for name in expert_names(CATALOG_SIZE):
        assert len(expert_description(name).split()) >= 8
    with pytest.raises(UnknownName, match="unknown expert 'astrology-tarot'") as err:
        expert_description("astrology-tarot")
    assert "coding-python" in err.value.accepted
    with pytest.raises(UnknownName):
        expert_description("coding-python-1")  # replicas start at -2


# ------------------------------------------------------------------ the router


@pytest.mark.parametrize(("prompt", "expected"), DOMAIN_PROMPTS)
def test_domain_prompts_reach_their_expert(router: Router, prompt: str, expected: str) -> None:
    name = router.names[router.route(prompt)]
    if expected.endswith("-"):
        assert name.startswith(expected), name
    else:
        assert name == expected


def test_a_small_bundle_routes_among_its_own_experts() -> None:
    small = Router.for_catalog(5)
    assert small.names[small.route("translate this sentence into French")] == ("translation-french")
    assert small.names[small.route("prove the theorem about this polynomial")] == ("math-algebra")


def test_route_batch_is_route_per_prompt(router: Router) -> None:
    prompts = [p for p, _ in DOMAIN_PROMPTS]
    assert router.route_batch(prompts) == [router.route(p) for p in prompts]


def test_prompts_without_known_words_route_deterministically(router: Router) -> None:
    for prompt in ("", "the of and", "xyzzy plugh qwertz", "!!! ???"):
        first = router.route(prompt)
        assert 0 <= first < router.n_experts
        assert router.route(prompt) == first
    # No feature at all: every score is 0 and the tie goes to the lowest index.
    assert router.route("") == 0
    assert not np.any(router.scores("the of and"))


def test_ties_go_to_the_lowest_index() -> None:
    # Replicas share their base's centroid: the base (lower index) wins.
    r = Router.for_catalog(CATALOG_SIZE + 1)
    assert r.route("fix this python function that throws a KeyError") == 0
    twins = Router(["b", "a"], {"a": "tennis serve racket", "b": "tennis serve racket"})
    assert twins.route("my tennis serve") == 0


def test_features_and_weights_are_unit_vectors(router: Router) -> None:
    f = features("Fix the Python bug")
    assert f.shape == (FEATURES,) and f.dtype == np.float64
    assert float(np.linalg.norm(f)) == pytest.approx(1.0)
    assert np.array_equal(f, features("fix the python BUG"))  # case-insensitive
    assert router.weights.shape == (CATALOG_SIZE, FEATURES)
    np.testing.assert_allclose(np.linalg.norm(router.weights, axis=1), 1.0)
    scores = router.scores("fix this python function")
    assert float(scores.max()) <= 1.0 + 1e-12


def test_the_router_documents_its_flops(router: Router) -> None:
    # A dense (experts x features) matrix-vector product plus the feature scaling.
    assert router.flops_per_route == 2 * 150 * FEATURES + 4 * FEATURES


def test_router_construction_errors() -> None:
    with pytest.raises(InvalidRequest, match="at least one expert"):
        Router([])
    with pytest.raises(InvalidRequest, match=r"distinct: \['law-tax'\] repeat"):
        Router(["law-tax", "coding-go", "law-tax"])
    with pytest.raises(UnknownName, match="unknown expert 'mystery'"):
        Router(["coding-go", "mystery"])
    assert Router(["mystery"], {"mystery": "riddles puzzles"}).n_experts == 1


_CHILD = """
import json, sys
from rdurack.workloads.coe.router import Router, features, hash_route, tokenize
prompts = json.loads(sys.argv[1])
r = Router.for_catalog(150)
print(json.dumps({
    "routes": r.route_batch(prompts),
    "hashes": [hash_route(tokenize(p), 16) for p in prompts],
    "features": [features(p).tolist() for p in prompts[:3]],
}))
"""


@pytest.mark.parametrize("hash_seed", ["0", "4242"])
def test_routing_is_the_same_in_another_process(router: Router, hash_seed: str) -> None:
    # Python's hash() is salted per process; a router built on it would disagree with
    # itself across the orchestrator and node agents. Another process, another salt:
    prompts = [p for p, _ in DOMAIN_PROMPTS] + ["xyzzy plugh", "ünïcödé prompt"]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(prompts)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    child = json.loads(done.stdout)
    assert child["routes"] == router.route_batch(prompts)
    assert child["hashes"] == [hash_route(tokenize(p), 16) for p in prompts]
    assert child["features"] == [features(p).tolist() for p in prompts[:3]]


# ------------------------------------------------------------------ policies


def test_router_policy_is_the_router(router: Router) -> None:
    prompts = [p for p, _ in DOMAIN_PROMPTS]
    assert route_requests(RoutingPolicy.ROUTER, router, prompts) == router.route_batch(prompts)
    assert route_requests("router", router, prompts[:2]) == router.route_batch(prompts[:2])
    assert RoutingPolicy("router") is RoutingPolicy.ROUTER


def test_hint_policy_takes_names_and_indices(router: Router) -> None:
    prompts = ["a", "b", "c", "d"]
    hints: list[str | int | None] = ["law-tax", 3, "17", "coding-python"]
    got = route_requests(RoutingPolicy.HINT, router, prompts, hints)
    assert got == [router.names.index("law-tax"), 3, 17, 0]


@pytest.mark.parametrize("hint", ["astrology-tarot", 150, -1, "150", True])
def test_unknown_hints_list_the_accepted_values(router: Router, hint: str | int) -> None:
    with pytest.raises(UnknownName, match="unknown expert") as err:
        route_requests("hint", router, ["x"], [hint])
    assert "coding-python" in err.value.accepted
    assert "an index 0..149" in err.value.accepted


def test_missing_hints_are_invalid_requests(router: Router) -> None:
    with pytest.raises(InvalidRequest, match="request 1 has no expert hint"):
        route_requests("hint", router, ["a", "b"], ["law-tax", None])
    with pytest.raises(InvalidRequest, match="request 0 has no expert hint"):
        route_requests("hint", router, ["a"], [""])
    with pytest.raises(InvalidRequest, match="2 prompts, no hints"):
        route_requests("hint", router, ["a", "b"])
    with pytest.raises(InvalidRequest, match="2 prompts, 1 hints"):
        route_requests("hint", router, ["a", "b"], ["law-tax"])


def test_hash_policy_is_a_stable_spread_of_token_ids(router: Router) -> None:
    prompts = [f"request number {i}" for i in range(300)]
    got = route_requests(RoutingPolicy.HASH, router, prompts)
    assert got == [hash_route(tokenize(p), router.n_experts) for p in prompts]
    assert got == route_requests("hash", router, prompts)  # deterministic
    assert all(0 <= e < router.n_experts for e in got)
    assert len(set(got)) > 100  # 300 prompts over 150 experts: spread, not clumped
    # It reads the tokens, not the meaning: the same words in another order move.
    assert hash_route(tokenize("ab"), 1 << 30) != hash_route(tokenize("ba"), 1 << 30)
    with pytest.raises(InvalidRequest, match=">= 1, got 0"):
        hash_route([1, 2], 0)


def test_unknown_policy_lists_the_accepted_ones(router: Router) -> None:
    with pytest.raises(UnknownName, match="unknown routing policy 'random'") as err:
        route_requests("random", router, ["x"])
    assert sorted(err.value.accepted) == ["hash", "hint", "router"]
