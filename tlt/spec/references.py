"""Which Secrets and ServiceAccounts a run's pods may name: the run's own, or those the cluster admin shares.

The operator creates the pods, so a tenant who may create a run needs no right of their own to read a
Secret or act as a ServiceAccount: whatever a pod template names, the pod gets. A run's own names are
those that start with `<run>.` (a run name is a DNS-1035 label, so it has no dot: no other run's name
and no operator-made child, e.g. `<run>-ray-token-xxxxx`, can start that way). Anything else must be
listed by the admin, in the operator's environment (not in the run): `TLT_OPERATOR_SHARED_SECRETS` and
`TLT_OPERATOR_SERVICE_ACCOUNTS`, comma-separated names. `tlt validate` reads the same variables, so it
refuses what the operator would.

Image pull secrets are not covered: only the kubelet reads them, no container sees their contents.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tlt.spec.run import RunSpec

SHARED_SECRETS_ENV = "TLT_OPERATOR_SHARED_SECRETS"
SERVICE_ACCOUNTS_ENV = "TLT_OPERATOR_SERVICE_ACCOUNTS"


@dataclass(frozen=True)
class SharedNames:
    """What the cluster admin lets every run name."""

    secrets: frozenset[str] = frozenset()
    service_accounts: frozenset[str] = frozenset()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> SharedNames:
        env = os.environ if environ is None else environ

        def names(var: str) -> frozenset[str]:
            return frozenset(n.strip() for n in env.get(var, "").split(",") if n.strip())

        return cls(names(SHARED_SECRETS_ENV), names(SERVICE_ACCOUNTS_ENV))


def reference_problems(run_name: str, spec: RunSpec, shared: SharedNames) -> list[str]:
    """One line per Secret or ServiceAccount the run's pods would name without the right to, field path first."""
    own = f"{run_name}."
    out: list[str] = []
    for role in ("policy", "rollout", "verifier"):
        template = getattr(spec, role).pod_template
        for i, var in enumerate(template.env):
            ref = var.secret_key_ref
            if ref is not None and not ref.name.startswith(own) and ref.name not in shared.secrets:
                out.append(
                    f"spec.{role}.podTemplate.env[{i}].secretKeyRef.name: Secret {ref.name!r} is not this "
                    f"run's: name one that starts with '{own}', or ask the cluster admin to list it in "
                    f"{SHARED_SECRETS_ENV}"
                )
        account = template.service_account_name
        if account is not None and not account.startswith(own) and account not in shared.service_accounts:
            out.append(
                f"spec.{role}.podTemplate.serviceAccountName: ServiceAccount {account!r} is not this run's: "
                f"name one that starts with '{own}', or ask the cluster admin to list it in "
                f"{SERVICE_ACCOUNTS_ENV}"
            )
    return out
