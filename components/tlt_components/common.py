"""What every TLT component shares: the image, the decorator options, the checkpoint mount, parameter
validation, logging."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import TypeAdapter, ValidationError

from tlt.spec.manifest_io import parse_run
from tlt.spec.run import Name, RoleSpec, TLTTrainingRun

# The worker image carries tlt, tlt_components and kfp (the `pipelines` extra): nothing is
# pip-installed when a component starts.
BASE_IMAGE: str = RoleSpec().image
COMPONENT_OPTIONS: dict[str, Any] = {"base_image": BASE_IMAGE, "install_kfp_package": False}
# Where the tlt-cluster pipeline mounts the run's checkpoint claim on the steps that read its outputs.
CHECKPOINT_MOUNT = "/tlt/checkpoint-volume"


def choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of `allowed`, else ValueError naming the parameter and the choices."""
    if value not in allowed:
        raise ValueError(f"parameter {name!r} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def at_least(name: str, value: int | float, low: int | float) -> int | float:
    """`value` if it is >= `low`, else ValueError naming the parameter."""
    if value < low:
        raise ValueError(f"parameter {name!r} must be >= {low}; got {value!r}")
    return value


def object_name(name: str, value: str) -> str:
    """`value` if it is a valid Kubernetes object name, else ValueError naming the parameter."""
    try:
        return TypeAdapter(Name).validate_python(value)
    except ValidationError:
        raise ValueError(
            f"parameter {name!r} must be a Kubernetes object name (lowercase letters, digits, '-' and '.', "
            f"at most 253 characters); got {value!r}"
        ) from None


def from_struct(value: Any) -> Any:
    """A KFP `dict` parameter as it was written: KFP carries dicts as protobuf Structs, whose
    numbers are all doubles (`steps: 3` arrives as 3.0), and the run spec's integers are strict.
    Integral floats become ints; a float field of the spec accepts an int unchanged."""
    if isinstance(value, dict):
        return {key: from_struct(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_struct(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_run_spec(run_spec: dict[str, Any]) -> TLTTrainingRun:
    """Validate a `run_spec` parameter (full manifest or bare spec) through `tlt.spec.manifest_io.parse_run`."""
    return parse_run(from_struct(run_spec), "run_spec")


def setup_logging() -> None:
    """INFO logs with timestamps on the component's output (KFP shows it as the task's log)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
