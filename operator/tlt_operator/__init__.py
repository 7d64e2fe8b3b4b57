"""The TLT Kubernetes operator: reconciles `TLTTrainingRun` objects into pods, a Service, a
ConfigMap and (for gang scheduling) a PodGroup. Import name `tlt_operator` (a package named
`operator` would shadow the standard library); run it with the `tlt-operator` command."""
