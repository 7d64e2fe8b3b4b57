"""The TLT pipelines: prepare_data -> train -> export_drafter -> evaluate_drafter, in two forms.

- `tlt-local` (`components/tlt_local_pipeline.yaml`): train runs in its own step (`mode` local,
  runtime `local_runtime`); every output travels as a KFP artifact.
- `tlt-cluster` (`components/tlt_cluster_pipeline.yaml`): train creates a TLTTrainingRun and
  follows it (`mode` cluster). The run's outputs stay on its checkpoint PVC, so export_drafter and
  evaluate_drafter mount that claim (`checkpoint_claim`, which must equal the run spec's
  `checkpoint.claimName`; train checks it before creating the run) at
  `tlt_components.common.CHECKPOINT_MOUNT` and read the final checkpoint there. The claim must be
  mountable by those steps' pods after the run (ReadWriteMany, or ReadWriteOnce on one node).

Why two pipelines and not one with a `dsl.If` on a mode parameter: the modes differ in what a user
must fill in (a claim for cluster, a runtime and work folder for local) and in each step's pod
(the PVC mount is part of the task's platform spec, so one pipeline would carry every step twice,
one copy per branch, and ask for a claim in local runs too). Two pipelines give each a form with
only its own parameters and a graph of four steps, as Kubeflow users upload and run them; KFP's
local runner, which the local end-to-end test uses, runs `tlt-local` as it is.

The run must train a drafter (`speculative.mode` static or tlt; locally on the `ray` runtime):
export_drafter fails, naming the reason, when training produced none. (No `dsl.If` around the
export: the local runner cannot evaluate conditions on task outputs.) Parameters reach the
components only as typed executor inputs, never a shell. `python -m tlt_components.pipeline
[FOLDER]` rewrites both YAML files; a test fails when they drift from this module.
"""

import argparse
import sys
from pathlib import Path

from kfp import compiler, dsl, kubernetes

from tlt_components.common import CHECKPOINT_MOUNT
from tlt_components.components import evaluate_drafter, export_drafter, prepare_data, train

COMPONENTS_DIR = Path(__file__).resolve().parents[1]
LOCAL_FILE = "tlt_local_pipeline.yaml"
CLUSTER_FILE = "tlt_cluster_pipeline.yaml"


def _export_and_evaluate(
    trained,
    data,
    export_dtype,
    eval_prompts,
    eval_draft_tokens,
    eval_max_new_tokens,
    eval_batch_size,
    eval_temperature,
    eval_dtype,
) -> tuple:
    """The steps after `train`, alike in both pipelines: export the drafter, then measure it. Returns both tasks."""
    exported = export_drafter(
        drafter=trained.outputs["drafter"], policy=trained.outputs["policy"], dtype=export_dtype
    ).set_display_name("export drafter")
    evaluated = evaluate_drafter(
        eagle=exported.outputs["eagle"],
        policy=trained.outputs["policy"],
        data=data.outputs["data"],
        num_prompts=eval_prompts,
        draft_tokens=eval_draft_tokens,
        max_new_tokens=eval_max_new_tokens,
        batch_size=eval_batch_size,
        temperature=eval_temperature,
        dtype=eval_dtype,
    ).set_display_name("evaluate drafter")
    return exported, evaluated


@dsl.pipeline(
    name="tlt-local",
    description="TLT on the pipeline's own pod: RL training with an online drafter; export and measure the drafter.",
)
def tlt_local_pipeline(
    run_spec: dict,
    local_runtime: str = "ray",
    work_dir: str = "",
    export_dtype: str = "auto",
    eval_prompts: int = 16,
    eval_draft_tokens: int = 4,
    eval_max_new_tokens: int = 128,
    eval_batch_size: int = 1,
    eval_temperature: float = 0.0,
    eval_dtype: str = "float32",
):
    data = prepare_data(run_spec=run_spec).set_display_name("prepare data")
    trained = train(
        run_spec=run_spec, data=data.outputs["data"], mode="local", local_runtime=local_runtime, work_dir=work_dir
    ).set_display_name("train")
    _export_and_evaluate(
        trained,
        data,
        export_dtype,
        eval_prompts,
        eval_draft_tokens,
        eval_max_new_tokens,
        eval_batch_size,
        eval_temperature,
        eval_dtype,
    )


@dsl.pipeline(
    name="tlt-cluster",
    description="TLT on a cluster: a TLTTrainingRun with an online drafter; export "
    "and measure the drafter from the run's checkpoint volume.",
)
def tlt_cluster_pipeline(
    run_spec: dict,
    checkpoint_claim: str,
    namespace: str = "default",
    run_name: str = "",
    poll_seconds: float = 10.0,
    timeout_seconds: float = 0.0,
    export_dtype: str = "auto",
    eval_prompts: int = 16,
    eval_draft_tokens: int = 4,
    eval_max_new_tokens: int = 128,
    eval_batch_size: int = 1,
    eval_temperature: float = 0.0,
    eval_dtype: str = "float32",
):
    data = prepare_data(run_spec=run_spec).set_display_name("prepare data")
    trained = train(
        run_spec=run_spec,
        data=data.outputs["data"],
        mode="cluster",
        namespace=namespace,
        run_name=run_name,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        checkpoint_claim=checkpoint_claim,
    ).set_display_name("train")
    for task in _export_and_evaluate(
        trained,
        data,
        export_dtype,
        eval_prompts,
        eval_draft_tokens,
        eval_max_new_tokens,
        eval_batch_size,
        eval_temperature,
        eval_dtype,
    ):
        kubernetes.mount_pvc(task, pvc_name=checkpoint_claim, mount_path=CHECKPOINT_MOUNT)


PIPELINES = {LOCAL_FILE: tlt_local_pipeline, CLUSTER_FILE: tlt_cluster_pipeline}


def compile_pipelines(folder: str | Path = COMPONENTS_DIR) -> list[Path]:
    """Compile every pipeline to its YAML file in `folder`."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = []
    for name, pipeline in PIPELINES.items():
        path = Path(folder) / name
        compiler.Compiler().compile(pipeline, str(path))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tlt_components.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder",
        nargs="?",
        type=Path,
        default=COMPONENTS_DIR,
        help=f"folder to write {LOCAL_FILE} and {CLUSTER_FILE} into (default {COMPONENTS_DIR})",
    )
    args = parser.parse_args(argv)
    for path in compile_pipelines(args.folder):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
