"""Kubeflow Pipelines v2 components of TLT and the pipeline that chains them.

    prepare_data -> train -> export_drafter -> evaluate_drafter

Each component is a lightweight Python component whose body only imports `tlt` /
`tlt_components` and calls a plain function here, so the work is unit-testable without KFP.
Parameters reach those functions as typed Python values (the run spec is validated by
`tlt.config_io.parse_run`); none is ever interpolated into a shell command.
`python -m tlt_components.pipeline` recompiles `components/tlt_pipeline.yaml`.
"""
