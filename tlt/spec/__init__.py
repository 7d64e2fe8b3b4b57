"""The run's spec: the `RunSpec` model and its parts, reading manifests, the CRD generated from the
model and its checks, the status model, and the checks `tlt validate` adds."""
