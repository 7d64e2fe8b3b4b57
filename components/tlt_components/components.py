"""The KFP v2 components: thin bodies that import `tlt_components` and call a plain function.

KFP ships each body's source to the executor on its own, so every import is inside the body; the
modules they call hold the logic and its validation. (No `from __future__ import annotations`
here: KFP reads the annotations as types.)
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from tlt_components.common import COMPONENT_OPTIONS


@dsl.component(**COMPONENT_OPTIONS)
def prepare_data(run_spec: dict, data: Output[Dataset]):
    """Validate the run spec's dataset (built-in task or JSONL/Parquet file) and write it with statistics."""
    from tlt_components.common import setup_logging
    from tlt_components.prepare import prepare_dataset

    setup_logging()
    data.metadata.update(prepare_dataset(run_spec, data.path))


@dsl.component(**COMPONENT_OPTIONS)
def train(
    run_spec: dict,
    data: Input[Dataset],
    mode: str,
    policy: Output[Model],
    drafter: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    local_runtime: str = "ray",
    namespace: str = "default",
    run_name: str = "",
    poll_seconds: float = 10.0,
    timeout_seconds: float = 0.0,
    work_dir: str = "",
    checkpoint_claim: str = "",
):
    """Train the run: `mode` cluster (a TLTTrainingRun, followed to the end; its outputs stay on the
    `checkpoint_claim` volume) or local (on this machine, `local_runtime` ray or single-process).
    Metrics and a Markdown report show in the KFP UI."""
    from pathlib import Path

    from tlt_components.common import setup_logging
    from tlt_components.train import run_train

    setup_logging()
    result = run_train(
        run_spec,
        data.path,
        mode=mode,
        local_runtime=local_runtime,
        policy_dir=policy.path,
        drafter_dir=drafter.path,
        namespace=namespace,
        run_name=run_name,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        work_dir=work_dir,
        checkpoint_claim=checkpoint_claim,
    )
    for name, value in result.metrics.items():
        metrics.log_metric(name, value)
    Path(report.path).write_text(result.report)
    policy.metadata.update(result.policy_metadata)
    drafter.metadata.update(result.drafter_metadata)


@dsl.component(**COMPONENT_OPTIONS)
def export_drafter(drafter: Input[Model], policy: Input[Model], eagle: Output[Model], dtype: str = "auto"):
    """Write the drafter checkpoint as a Hugging Face EAGLE folder (vLLM-loadable) for the policy (a cluster
    run's: from its checkpoint volume, mounted by the tlt-cluster pipeline)."""
    from tlt_components.common import setup_logging
    from tlt_components.train import export_trained_drafter

    setup_logging()
    result = export_trained_drafter(drafter.path, drafter.metadata, policy.path, eagle.path, dtype=dtype)
    eagle.metadata.update(
        {"format": "eagle", "tensors": result.tensors, "parameters": result.parameters, "dtype": result.dtype}
    )


@dsl.component(**COMPONENT_OPTIONS)
def evaluate_drafter(
    eagle: Input[Model],
    policy: Input[Model],
    data: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[Markdown],
    num_prompts: int = 16,
    draft_tokens: int = 4,
    max_new_tokens: int = 128,
    batch_size: int = 1,
    temperature: float = 0.0,
    dtype: str = "float32",
):
    """Accept length and speedup of the exported drafter against the policy on held-out prompts, as
    Metrics and a Markdown report."""
    from pathlib import Path

    from tlt_components.common import setup_logging
    from tlt_components.evaluate import HEADLINE_KEYS, evaluate_export
    from tlt_components.report import metrics_report

    setup_logging()
    values = evaluate_export(
        eagle.path,
        policy.path,
        data.path,
        num_prompts=num_prompts,
        draft_tokens=draft_tokens,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        temperature=temperature,
        dtype=dtype,
        policy_metadata=policy.metadata,
    )
    for name, value in values.items():
        metrics.log_metric(name, value)
    Path(report.path).write_text(metrics_report("Drafter evaluation", values, HEADLINE_KEYS))
