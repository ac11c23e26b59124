"""Request bodies of the operator API: validated by the handlers, described by the OpenAPI document."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_FREEZE_SECONDS = 10 * 365 * 86400.0


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class FreezeRequest(Body):
    target: str | None = Field(None, max_length=300)
    """namespace/model (a bare model means default/model); omitted: the whole daemon."""
    reason: str = Field(min_length=1, max_length=1000)
    duration_seconds: float | None = Field(None, gt=0, le=MAX_FREEZE_SECONDS, alias="durationSeconds")
    """Omitted: until lifted."""


class UnfreezeRequest(Body):
    target: str | None = Field(None, max_length=300)
    reason: str = Field("lifted by the API", min_length=1, max_length=1000)


class ApproveRequest(Body):
    reason: str = Field("approved", min_length=1, max_length=1000)


class ClearBadVersionRequest(Body):
    target: str = Field(min_length=1, max_length=300)
    version: int = Field(ge=0, le=2**53)
    reason: str = Field("cleared by the API", min_length=1, max_length=1000)


class MarkBadVersionRequest(Body):
    target: str = Field(min_length=1, max_length=300)
    """namespace/model of a target a policy names (a bare model means default/model)."""
    version: int = Field(ge=1, le=2**53)
    reason: str = Field(min_length=1, max_length=1000)
    """Required: why the version is bad (journaled with the token's name)."""


class UnpinRequest(Body):
    target: str = Field(min_length=1, max_length=300)
    reason: str = Field("ended by the API", min_length=1, max_length=1000)
