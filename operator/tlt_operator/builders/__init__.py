"""Pure builders, one per child kind: `build_x(run, spec, ...) -> dict` with no I/O."""

from .configmap import build_configmap
from .event import build_event
from .pod import build_pod
from .podgroup import build_podgroup
from .resourceclaim import build_resource_claim_template
from .service import build_service

__all__ = ["build_configmap", "build_event", "build_pod", "build_podgroup", "build_resource_claim_template",
           "build_service"]
