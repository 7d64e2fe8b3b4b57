"""A run's pods name only the run's own Secrets and ServiceAccounts (`<run>.`-prefixed) or those the admin
shares; every other reference is refused with its field path."""

from __future__ import annotations

from tlt.spec.references import SharedNames, reference_problems
from tlt.spec.run import RunSpec


def _spec(env: list[dict], account: str | None = None) -> RunSpec:
    template: dict = {"env": env}
    if account:
        template["serviceAccountName"] = account
    return RunSpec.model_validate({"rollout": {"podTemplate": template}})


def _secret(name: str) -> list[dict]:
    return [{"name": "A", "value": "1"}, {"name": "T", "secretKeyRef": {"name": name, "key": "token"}}]


def test_own_secrets_and_accounts_pass():
    assert reference_problems("job", _spec(_secret("job.hf-token"), "job.worker"), SharedNames()) == []


def test_another_runs_token_and_a_look_alike_prefix_are_refused():
    for name in ("victim-ray-token-ab12c", "job-ray-token-ab12c", "jobs.x", "job"):
        (problem,) = reference_problems("job", _spec(_secret(name)), SharedNames())
        assert problem.startswith("spec.rollout.podTemplate.env[1].secretKeyRef.name: Secret")
        assert "TLT_OPERATOR_SHARED_SECRETS" in problem


def test_a_borrowed_service_account_is_refused():
    (problem,) = reference_problems("job", _spec([], "namespace-admin"), SharedNames())
    assert problem.startswith("spec.rollout.podTemplate.serviceAccountName: ServiceAccount 'namespace-admin'")


def test_the_admins_lists_allow_named_ones_only():
    shared = SharedNames.from_environment(
        {"TLT_OPERATOR_SHARED_SECRETS": " hf , regcred", "TLT_OPERATOR_SERVICE_ACCOUNTS": "tlt-worker"}
    )
    assert reference_problems("job", _spec(_secret("hf"), "tlt-worker"), shared) == []
    assert len(reference_problems("job", _spec(_secret("other"), "admin"), shared)) == 2
