"""The CoE router of a model bundle, byte-level tokens, and the routing policies.

A Samba-CoE-style bundle is a catalog of experts (catalog.py) plus a router that sends
each prompt to one expert. Here the router is real but small: a deterministic linear classifier
over TF-IDF-weighted, hashed bag-of-words and character-trigram features, one centroid
per expert built from the expert's keyword description (its "training data"). Prompt
words the catalog never uses are dropped: they could only add hash collisions. It
routes obviously-domain prompts right and costs next to nothing to run. The *emulated*
time of routing is charged elsewhere (the timing model of a Llama2-7B router prefill);
nothing here models time.

Cost of one `route` call, in FLOPs: features are hashed (no FLOPs), IDF scaling and
L2 normalisation ~4 x FEATURES, the linear layer 2 x experts x FEATURES: 1.2 MFLOP
for 150 experts at 4096 features (`Router.flops_per_route`), against ~10^10 FLOPs per
prompt token of the Llama2-7B router the timing model charges.

Every hash is blake2b, never Python's hash(): that one is salted per process
(PYTHONHASHSEED), and the orchestrator, node agents and tests must route alike.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.workloads.coe.catalog import expert_description, expert_names

VOCAB = 256  # byte-level tokens: one per UTF-8 byte
# Hashed feature dimension. The 150-expert catalog has ~3,100 distinct keys (1,010
# words, the rest trigrams): at 1024 features every column holds ~3 of them and
# collisions sent 1 obviously-domain prompt in 10 to a wrong domain; at 4096 none of
# ~100 such prompts went wrong. Cost stays small (see `Router.flops_per_route`).
FEATURES = 4096
# A word is worth one unit; its character trigrams share TRIGRAM_WEIGHT between them,
# so morphology ("translating" ~ "translate") helps without outweighing exact words.
TRIGRAM_WEIGHT = 1.0


# ------------------------------------------------------------------ tokens


def tokenize(text: str) -> list[int]:
    """Byte-level tokens: the UTF-8 bytes of `text`."""
    return list(text.encode("utf-8"))


def detokenize(ids: Sequence[int]) -> str:
    """Text of byte-level tokens; invalid UTF-8 (a cut multi-byte char) becomes U+FFFD."""
    bad = [t for t in ids if not 0 <= t < VOCAB]
    if bad:
        raise InvalidRequest(f"token ids must be in [0, {VOCAB}): got {bad[:5]}")
    return bytes(ids).decode("utf-8", errors="replace")


# ------------------------------------------------------------------ the router

_WORD = re.compile(r"[^\W_]+")  # runs of letters and digits, any script
# Function words say nothing about the domain; left in, they would only add hash
# collisions. One-character words ("x", "a", "I") are dropped for the same reason.
_STOPWORD_TEXT = """
    about above after again all also am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few
    for from further get got had has have having he her here hers him his how if in
    is it its just me more most my no nor not now of off on once only or other our
    out over own please same she should so some such than that the their them then
    there these they this those through to too under until up very was we were what
    when where which while who whom why will with would you your
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def _add(vec: npt.NDArray[np.float64], key: str, weight: float) -> None:
    # Signed feature hashing: a collision adds + or - at random, so collisions cancel
    # on average instead of always adding similarity.
    h = _hash64(key)
    vec[h % vec.size] += weight if (h >> 63) & 1 else -weight


def _keys(text: str) -> list[tuple[str, float]]:
    """(feature key, weight) of each word and of its character trigrams; case-insensitive,
    stopwords dropped."""
    out: list[tuple[str, float]] = []
    for word in _WORD.findall(text.lower()):
        if len(word) < 2 or word in STOPWORDS:
            continue
        out.append(("w:" + word, 1.0))
        marked = f"<{word}>"  # boundaries make "go" differ from the "go" in "golang"
        grams = [marked[i : i + 3] for i in range(len(marked) - 2)]
        out += [("c:" + g, TRIGRAM_WEIGHT / len(grams)) for g in grams]
    return out


def _hashed(
    keys: list[tuple[str, float]], dim: int, known: frozenset[str] | None = None
) -> npt.NDArray[np.float64]:
    """Hashed features of `keys`, not normalised; only `known` keys if given."""
    vec = np.zeros(dim, dtype=np.float64)
    for key, weight in keys:
        if known is None or key in known:
            _add(vec, key, weight)
    return vec


def _normalised(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """L2-normalised along the last axis; zero rows stay zero."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    out: npt.NDArray[np.float64] = x / np.where(norm > 0, norm, 1.0)
    return out


def features(text: str, dim: int = FEATURES) -> npt.NDArray[np.float64]:
    """The L2-normalised hashed features of `text` (the zero vector if it has no word)."""
    return _normalised(_hashed(_keys(text), dim))


class Router:
    """A linear router: weights (experts x features), one L2-normalised centroid per
    expert from its description; a prompt goes to the expert of highest cosine
    similarity, ties to the lowest index."""

    def __init__(
        self,
        names: Sequence[str],
        descriptions: Mapping[str, str] | None = None,
        dim: int = FEATURES,
    ) -> None:
        if not names:
            raise InvalidRequest("a router needs at least one expert")
        if len(set(names)) != len(names):
            dupes = sorted(n for n, count in Counter(names).items() if count > 1)
            raise InvalidRequest(f"expert names must be distinct: {dupes} repeat")
        if dim < 1:
            raise InvalidRequest(f"the feature dimension must be >= 1, got {dim}")
        given = descriptions or {}
        self.names = list(names)
        self.dim = dim
        keys = [_keys(given[n] if n in given else expert_description(n)) for n in names]
        self._known = frozenset(k for ks in keys for k, _ in ks)
        raw = np.stack([_hashed(ks, dim) for ks in keys])
        # Inverse document frequency per feature over the experts' descriptions
        # (smoothed, as scikit-learn's TfidfTransformer): a keyword every expert of a
        # domain shares counts less than one only its specialty has.
        df = np.count_nonzero(raw, axis=0)
        self.idf = np.log((1.0 + len(names)) / (1.0 + df)) + 1.0
        self.weights = _normalised(raw * self.idf)
        self.idf.flags.writeable = False
        self.weights.flags.writeable = False

    @classmethod
    def for_catalog(cls, n: int, dim: int = FEATURES) -> Router:
        """The router of a bundle of the first `n` catalog experts."""
        return cls(expert_names(n), dim=dim)

    @property
    def n_experts(self) -> int:
        return len(self.names)

    @property
    def flops_per_route(self) -> int:
        """FLOPs of one route: IDF scaling and normalisation (multiply, square, sum,
        divide: 4 per feature) plus the linear layer (a multiply and an add per weight)."""
        return 4 * self.dim + 2 * self.n_experts * self.dim

    def scores(self, text: str) -> npt.NDArray[np.float64]:
        """Cosine similarity of `text` to each expert, (experts,)."""
        out: npt.NDArray[np.float64] = self.weights @ _normalised(
            _hashed(_keys(text), self.dim, self._known) * self.idf
        )
        return out

    def route(self, text: str) -> int:
        # Rounded so that experts with equal centroids (replicas) tie exactly whatever
        # order BLAS sums in; argmax then picks the lowest index.
        return int(np.argmax(np.round(self.scores(text), 12)))

    def route_batch(self, texts: Sequence[str]) -> list[int]:
        return [self.route(t) for t in texts]


# ------------------------------------------------------------------ policies


class RoutingPolicy(StrEnum):
    """How a CoE request picks its expert."""

    ROUTER = "router"  # the Router classifies the prompt (the default)
    HINT = "hint"  # the request names its expert, by name or index
    HASH = "hash"  # stable hash of the prompt's token ids, modulo the experts


def parse_policy(value: str) -> RoutingPolicy:
    try:
        return RoutingPolicy(value)
    except ValueError:
        raise UnknownName("routing policy", value, [p.value for p in RoutingPolicy]) from None


def hash_route(ids: Sequence[int], n_experts: int) -> int:
    """blake2b of the token ids (4 bytes each, little-endian) modulo `n_experts`."""
    if n_experts < 1:
        raise InvalidRequest(f"the number of experts must be >= 1, got {n_experts}")
    data = b"".join(int(t).to_bytes(4, "little", signed=True) for t in ids)
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "little") % n_experts


def resolve_hint(hint: str | int, names: Sequence[str]) -> int:
    """An expert named by a hint: its name, its index, or its index as a string."""
    n = len(names)
    if isinstance(hint, int) and not isinstance(hint, bool) and 0 <= hint < n:
        return hint
    if isinstance(hint, str):
        if hint in names:
            return list(names).index(hint)
        if hint.isdecimal() and int(hint) < n:
            return int(hint)
    raise UnknownName("expert", str(hint), [*names, f"an index 0..{n - 1}"])


def route_requests(
    policy: RoutingPolicy | str,
    router: Router,
    prompts: Sequence[str],
    hints: Sequence[str | int | None] | None = None,
) -> list[int]:
    """The expert index of each prompt under `policy`. `hints` (one per prompt) are read
    only by the hint policy."""
    policy = parse_policy(policy) if not isinstance(policy, RoutingPolicy) else policy
    if policy is RoutingPolicy.ROUTER:
        return router.route_batch(prompts)
    if policy is RoutingPolicy.HASH:
        return [hash_route(tokenize(p), router.n_experts) for p in prompts]
    if hints is None or len(hints) != len(prompts):
        got = "no hints" if hints is None else f"{len(hints)} hints"
        raise InvalidRequest(
            f"the hint policy needs one hint per prompt: {len(prompts)} prompts, {got}"
        )
    out: list[int] = []
    for i, hint in enumerate(hints):
        if hint is None or hint == "":
            raise InvalidRequest(f"request {i} has no expert hint (policy 'hint')")
        out.append(resolve_hint(hint, router.names))
    return out
