"""Speculative decoding: its assumptions, in one place, and its expected yield.

A draft model proposes `draft_tokens` (k) tokens per iteration, running k decode steps
on the same sockets as the target; the target then verifies them in one pass of k + 1
new tokens per sequence (rack/kernels.step's `new_tokens`). With acceptance rate a (the
chance that the target accepts a drafted token, each independently), an iteration
yields (1 - a^(k+1)) / (1 - a) tokens on average (Leviathan et al., "Fast Inference
from Transformers via Speculative Decoding", ICML 2023, eq. 1): the accepted drafts
plus the one token the target's pass always adds.

PAPER Table IV used speculative decoding for Llama 3.1 70B and 405B without publishing
the draft model, k or a. They are assumptions here, with their reasons below, and a
caller (the calibration, `--draft-model`, `--draft-tokens`, `--acceptance`) may pass
others: `SpeculativeSetting` is the one place that holds them.
"""

from __future__ import annotations

from pydantic import Field, ValidationError

from rdurack.config import Config
from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.calibration import fitted_values
from rdurack.rack.models import ModelSpec

# The draft of each target that has one among the presets: the smallest model of the
# target's family. A draft must share the target's tokenizer (the target verifies the
# draft's token ids); `resolve` checks that their vocabularies match.
DRAFT_MODELS: dict[str, str] = {
    "llama3.1-8b": "llama3.2-1b",
    "llama3.1-70b": "llama3.1-8b",
    "llama3.1-405b": "llama3.1-8b",
    "llama2-13b": "llama2-7b",
    "llama2-70b": "llama2-7b",
}
# Why the draft model is what it is; k and a are assumptions of the joint calibration
# (rack/calibration.py: speculative.draft_tokens, speculative.acceptance), fitted with the
# others to PAPER Table IV's 70B and 405B rows (docs/serving.md).
DRAFT_MODEL_REASON = (
    "assumption: PAPER does not name its draft; the smallest preset of the target's "
    "family with the same tokenizer (Llama 3.1 8B for 70B and 405B, Llama 3.2 1B for 8B), "
    "the usual pairing because a draft must emit the target's token ids"
)


def default_draft_tokens() -> int:
    return round(fitted_values()["speculative.draft_tokens"])


def default_acceptance() -> float:
    return fitted_values()["speculative.acceptance"]


class SpeculativeSetting(Config):
    """Speculative decoding's three assumptions: the draft model (DRAFT_MODEL_REASON),
    k and a (fitted: rack/calibration.py)."""

    # None: the target's draft in DRAFT_MODELS.
    draft_model: str | None = None
    draft_tokens: int = Field(default_factory=default_draft_tokens, ge=1, le=64)
    acceptance: float = Field(default_factory=default_acceptance, ge=0.0, le=1.0)

    @classmethod
    def of(
        cls,
        draft_model: str | None = None,
        draft_tokens: int | None = None,
        acceptance: float | None = None,
    ) -> SpeculativeSetting:
        """A setting with the defaults where a value is None; a bad value is one
        InvalidRequest line naming it."""
        given = {"draft_tokens": draft_tokens, "acceptance": acceptance}
        try:
            return cls(draft_model=draft_model, **{k: v for k, v in given.items() if v is not None})
        except ValidationError as e:
            first = e.errors()[0]
            field = str(first["loc"][0]).replace("_", "-")
            raise InvalidRequest(f"{field}: {first['msg']}") from None

    @property
    def tokens_per_iteration(self) -> float:
        return expected_tokens(self.draft_tokens, self.acceptance)

    def draft_of(self, target: ModelSpec, models: dict[str, ModelSpec]) -> ModelSpec:
        """The draft model for `target`: this setting's, else the target's default; it
        must be a known model with the target's vocabulary."""
        name = self.draft_model or DRAFT_MODELS.get(target.name)
        if name is None:
            raise InvalidRequest(
                f"{target.name} has no default draft model (defaults exist for "
                f"{', '.join(sorted(DRAFT_MODELS))}): name one with --draft-model"
            )
        if name not in models:
            raise UnknownName("draft model", name, sorted(models))
        draft = models[name]
        if draft.vocab != target.vocab:
            raise InvalidRequest(
                f"draft {draft.name} (vocabulary {draft.vocab}) cannot draft for "
                f"{target.name} (vocabulary {target.vocab}): the target verifies the "
                "draft's token ids, so both need one tokenizer"
            )
        return draft


def expected_tokens(draft_tokens: int, acceptance: float) -> float:
    """Tokens an iteration yields on average: (1 - a^(k+1)) / (1 - a), k + 1 at a = 1."""
    k, a = draft_tokens, acceptance
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)
