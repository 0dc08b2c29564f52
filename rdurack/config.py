"""The base of every config model in rdurack: frozen, no unknown fields, finite numbers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Config(BaseModel):
    """Base of every config model: frozen, no unknown fields."""

    # No infinities or NaNs: a number that is not finite is never a hardware figure.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
