"""Kubeflow Pipelines v2 components of TLT and the pipeline that chains them.

    prepare_data -> train -> export_drafter -> evaluate_drafter

as two pipelines: `tlt-local` (train in the pipeline's pod) and `tlt-cluster` (train as a
TLTTrainingRun; the later steps read its outputs from its mounted checkpoint volume).

Each component is a lightweight Python component whose body only imports `tlt` /
`tlt_components` and calls a plain function here, so the work is unit-testable without KFP.
Parameters reach those functions as typed Python values (the run spec is validated by
`tlt.spec.manifest_io.parse_run`); none is ever interpolated into a shell command.
`python -m tlt_components.pipeline` recompiles `components/tlt_local_pipeline.yaml` and
`components/tlt_cluster_pipeline.yaml`.
"""
