"""How many experts a batch of tokens touches, and how the work spreads over sockets.

A mixture-of-experts layer reads the weights of every expert that at least one of its
tokens chose. With `tokens` tokens each choosing k of E experts, an expert escapes every
token with probability (1 - k/E)^tokens, so the expected count touched is

    E x (1 - (1 - k/E)^tokens)

Group-limited routing (DeepSeek-V3: 4 of 8 groups, then 8 experts among them) keeps each
expert's chance at k/E, so the expectation is the same.

Placed expert-parallel (whole experts, E/S on each of S sockets), a layer waits for its
busiest socket: the expected *largest* count over the sockets, above the mean when few
tokens route (at batch 1, 8 experts over 16 sockets put two on one socket more often than
not). That expectation has no closed form; it is estimated by sampling routings (seeded,
so a figure is the same every run; cached, as a serve sums many steps of one batch).

Assumption (documented in docs/moe.md): tokens route independently and uniformly over the
experts, as the load-balancing objective of training aims for. Real routing is skewed,
which makes the busiest socket busier; the figures here are a lower bound on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rdurack.rack.models import MoeSpec

# Routings sampled for the busiest socket's expectation: up to MAX_SAMPLES, fewer where
# tokens are many (the random numbers drawn stay under BUDGET), never under MIN_SAMPLES.
# The busiest count varies by about one expert between samples, so 64 samples put its
# mean within about 0.1 expert.
MAX_SAMPLES = 2000
MIN_SAMPLES = 64
BUDGET = 4_000_000
SEED = 0
# Below this chance of an expert escaping every token, every expert counts as touched.
ALL_TOUCHED = 1e-9


@dataclass(frozen=True, slots=True)
class ExpertLoad:
    """Per layer, for `tokens` tokens over `shards` sockets holding E/shards experts each."""

    touched: float  # distinct experts touched, over all sockets (expected)
    busiest_experts: float  # distinct experts the busiest socket runs (expected)
    busiest_assignments: float  # (token, expert) pairs the busiest socket computes


def touched(moe: MoeSpec, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens touch in one layer."""
    e, k = moe.routed_experts, moe.active_experts
    return e * (1.0 - (1.0 - k / e) ** tokens)


def expert_load(moe: MoeSpec, tokens: int, shards: int) -> ExpertLoad:
    """The load of one layer placed expert-parallel over `shards` sockets (1: one socket
    holds them all)."""
    if moe.routed_experts % shards:
        raise ValueError(f"{moe.routed_experts} experts do not divide over {shards} sockets")
    return _load(moe, tokens, shards)


@lru_cache(maxsize=1024)
def _load(moe: MoeSpec, tokens: int, shards: int) -> ExpertLoad:
    e, k = moe.routed_experts, moe.active_experts
    mean = touched(moe, tokens)
    if shards == 1:
        return ExpertLoad(mean, mean, float(tokens * k))
    if (1.0 - k / e) ** tokens < ALL_TOUCHED:
        # Every expert is touched; assignments are close to even at this many tokens.
        return ExpertLoad(float(e), float(e // shards), tokens * k / shards)
    experts, assignments = _sample(moe, tokens, shards)
    return ExpertLoad(mean, experts, assignments)


def _sample(moe: MoeSpec, tokens: int, shards: int) -> tuple[float, float]:
    """(expected busiest distinct experts, expected busiest assignments), sampled."""
    rng = np.random.default_rng(SEED)
    e, k = moe.routed_experts, moe.active_experts
    groups, chosen = moe.expert_groups, moe.groups_per_token
    per_group = e // groups
    n = max(MIN_SAMPLES, min(MAX_SAMPLES, BUDGET // (tokens * (groups + chosen * per_group))))
    # For each sample and token: `chosen` groups, then k experts among their experts.
    group_keys = rng.random((n, tokens, groups))
    picked_groups = np.argsort(group_keys, axis=2)[:, :, :chosen]
    candidates = (picked_groups[..., None] * per_group + np.arange(per_group)).reshape(
        n, tokens, chosen * per_group
    )
    keys = rng.random(candidates.shape)
    picks = np.take_along_axis(candidates, np.argsort(keys, axis=2)[:, :, :k], axis=2)
    shard = picks // (e // shards)  # experts lie in contiguous blocks of E/shards
    sample_ix = np.arange(n)[:, None, None]
    counts = np.zeros((n, shards))
    np.add.at(counts, (np.broadcast_to(sample_ix, shard.shape), shard), 1.0)
    hit = np.zeros((n, e), dtype=bool)
    hit[np.broadcast_to(sample_ix, picks.shape), picks] = True
    distinct = hit.reshape(n, shards, e // shards).sum(axis=2)
    return float(distinct.max(axis=1).mean()), float(counts.max(axis=1).mean())
