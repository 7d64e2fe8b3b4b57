"""The run's roles, each a plain class or set of functions that a loop holds in-process or Ray runs as an
actor: the policy (`policy`: the update on one device; `policy_group`: the update sharded over ranks), the
rollout worker (`rollout`, `vllm_rollout`; its parts `shard_generation`, `rollout_drafter`, `rollout_state`,
`after_rollout`) and the shared services (`services`: verifiers, the drafter hub)."""
