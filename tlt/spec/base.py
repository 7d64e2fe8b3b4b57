"""The base of every spec section of `tlt.spec.run` (camelCase on the wire, unknown fields refused) and the
types the sections share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A path: no control characters (a newline or a NUL in a path is a typo, and breaks logs, mounts and shells).
PathStr = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")]
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
Quantity = Annotated[str, Field(max_length=64, pattern=r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")]
ShortStr = Annotated[str, Field(max_length=253)]
# An image reference (the distribution grammar, simplified): optional registry host[:port], a lowercase
# path of components joined by '/', an optional tag, an optional sha256 digest.
IMAGE_PATTERN = (
    r"^([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*"
    r"(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
# A Kubernetes label value: empty, or at most 63 letters, digits, '-', '_' and '.', starting and
# ending with a letter or digit.
LabelValue = Annotated[str, Field(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
# A label or taint key (a qualified name): an optional DNS-subdomain prefix and '/', then a name of at
# most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
QUALIFIED_NAME = (
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
QualifiedName = Annotated[str, Field(max_length=316, pattern=f"^{QUALIFIED_NAME}$")]


class Spec(BaseModel):
    """Base of every spec section: camelCase aliases, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        strict=True,  # as the apiserver: "10" is not an integer, "true" is not a boolean
    )
