"""The TLT pipeline: prepare_data -> train -> export_drafter -> evaluate_drafter.

The run must train a drafter (`speculative.mode` static or tlt; locally on the `ray` runtime):
export_drafter fails, naming mode and runtime, when training produced none. (No `dsl.If` around
the export: KFP's local runner, which the end-to-end test uses, cannot evaluate conditions on
task outputs.) The compiled YAML is
checked in as `components/tlt_pipeline.yaml`; `python -m tlt_components.pipeline [OUT]`
rewrites it, and a test fails when it drifts from this file.
"""

import argparse
import sys
from pathlib import Path

from kfp import compiler, dsl

from tlt_components.components import evaluate_drafter, export_drafter, prepare_data, train

PIPELINE_NAME = "tlt-train-export-evaluate"
PIPELINE_FILE = Path(__file__).resolve().parents[1] / "tlt_pipeline.yaml"
DESCRIPTION = "TLT: RL training with an online drafter; export and measure the drafter."


@dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTION)
def tlt_pipeline(
    run_spec: dict,
    mode: str,
    local_runtime: str = "ray",
    namespace: str = "default",
    run_name: str = "",
    poll_seconds: float = 10.0,
    timeout_seconds: float = 0.0,
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
        run_spec=run_spec,
        data=data.outputs["data"],
        mode=mode,
        local_runtime=local_runtime,
        namespace=namespace,
        run_name=run_name,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        work_dir=work_dir,
    ).set_display_name("train")
    exported = export_drafter(
        drafter=trained.outputs["drafter"], policy=trained.outputs["policy"], dtype=export_dtype
    ).set_display_name("export drafter")
    evaluate_drafter(
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

def compile_pipeline(path: str | Path = PIPELINE_FILE) -> Path:
    """Compile the pipeline to YAML at `path`."""
    path = Path(path)
    compiler.Compiler().compile(tlt_pipeline, str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tlt_components.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=PIPELINE_FILE,
                        help=f"YAML to write (default {PIPELINE_FILE})")
    args = parser.parse_args(argv)
    print(f"wrote {compile_pipeline(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
