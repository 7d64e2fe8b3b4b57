"""The base of every spec section of `tlt.config` (camelCase on the wire, unknown fields refused) and the
types the sections share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

PathStr = Annotated[str, Field(min_length=1, max_length=1024)]


class Spec(BaseModel):
    """Base of every spec section: camelCase aliases, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True,
        strict=True,  # as the apiserver: "10" is not an integer, "true" is not a boolean
    )
