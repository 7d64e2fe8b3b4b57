"""Pure builders, one per child kind: `build_x(run, spec, ...) -> dict` with no I/O."""

from .configmap import build_configmap
from .event import build_event
from .pod import build_pod
from .podgroup import build_podgroup
from .reports import build_reports_configmap
from .resourceclaim import build_resource_claim_template
from .security import build_network_policy, build_ray_token_secret, build_worker_identity
from .service import build_service

__all__ = [
    "build_configmap",
    "build_event",
    "build_network_policy",
    "build_pod",
    "build_podgroup",
    "build_ray_token_secret",
    "build_reports_configmap",
    "build_resource_claim_template",
    "build_service",
    "build_worker_identity",
]
