"""The run spec: ONE schema for `run.yaml`, the `TLTTrainingRun` CRD and the KFP components.

Field names are camelCase on the wire (YAML, the Kubernetes API) and snake_case in Python.
Every field carries a description, a default where one makes sense, and bounds; strings and
lists are bounded so the CRD's CEL rules pass the apiserver's cost check. Cross-field rules
are written twice on purpose: as pydantic validators here (local `tlt validate`, `tlt train`)
and as CEL rules in the CRD (`tlt/spec/crd.py`); `tests/schema` checks both reject the same files.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tlt.spec.base import (
    IMAGE_PATTERN,
    LabelValue,
    Name,
    PathStr,
    QualifiedName,
    ShortStr,
    Spec,
)

# The checkpoint, speculative and drafter sections live in their own modules; imported from here as every
# section is (the CRD, the builders and the tests read them from tlt.spec.run).
from tlt.spec.checkpoint import (  # noqa: F401
    FORBIDDEN_MOUNT,
    MSG_CHECKPOINT_CANONICAL,
    MSG_CHECKPOINT_MOUNT,
    MSG_CHECKPOINT_PATH,
    NON_CANONICAL,
    PARENT_SEGMENT,
    POD_OWN_MOUNTS,
    TOKEN_DIRS,
    CheckpointSpec,
)
from tlt.spec.pod_template import (  # noqa: F401 (re-exported)
    MSG_RESERVED,
    RESERVED_PREFIX,
    EnvVar,
    PodOverrides,
    Resources,
    SecretKeyRef,
    Toleration,
)
from tlt.spec.rollout_mode import RolloutModeSpec
from tlt.spec.scheduling import PodGroupPolicy, RunPolicy, SchedulingPolicy  # noqa: F401 (re-exported)
from tlt.spec.speculative import ArmSpec, DrafterSpec, HistorySpec, SpeculativeSpec  # noqa: F401 (re-exported)

API_GROUP = "tlt.dev"
API_VERSION = "v1alpha1"
KIND = "TLTTrainingRun"
PLURAL = "tltrainingruns"
SHORT_NAME = "tltrun"

# Ray's ports on the policy pod (GCS, Ray client; tlt_operator.names): the metrics port must be another.
GCS_PORT = 6379
RAY_CLIENT_PORT = 10001
MSG_METRICS_PORT = (
    f"monitoring.metricsPort must differ from Ray's ports on the policy pod ({GCS_PORT} GCS, "
    f"{RAY_CLIENT_PORT} Ray client)"
)

MSG_PARTIAL_VLLM = (
    "algorithm.rollout.mode 'partial' runs on rollout.engine 'tlt' (the vLLM backend does not stop a rollout "
    "early and continue its responses): set rollout.engine: tlt or algorithm.rollout.mode: sync"
)


class ModelSpec(Spec):
    """The policy model."""

    path: PathStr | None = Field(
        None,
        description="Local folder of a Hugging Face Qwen2/Qwen2.5/Qwen3 (dense)/Llama causal LM (with its tokenizer). "
        "Empty: the built-in task's warm-started policy.",
    )
    dtype: Literal["bfloat16", "float32", "float64"] = Field(
        "bfloat16", description="Compute dtype of the policy in rollout and update."
    )
    max_context: int = Field(1024, ge=16, le=131072, description="Prompt plus response tokens, at most.")


class BuiltinTaskSpec(Spec):
    """The built-in reasoning task (generated problems with a long-tailed response length)."""

    num_train: int = Field(4096, ge=16, le=10_000_000, description="Training problems generated.")
    num_eval: int = Field(256, ge=8, le=100_000, description="Held-out problems generated.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the problem generator.")


class DatasetSpec(Spec):
    """Prompts and reference answers."""

    source: Literal["builtin", "file"] = Field(
        "builtin", description="`builtin`: the built-in reasoning task; `file`: a JSONL or Parquet file."
    )
    path: PathStr | None = Field(None, description="JSONL or Parquet file when source is `file`.")
    prompt_key: ShortStr = Field("question", min_length=1, description="Record field holding the prompt.")
    answer_key: ShortStr = Field("answer", min_length=1, description="Record field holding the reference answer.")
    answer_format: Literal["exact", "number", "math", "gsm8k"] = Field(
        "number",
        description="How rewards compare answers: exact string, number, math equivalence, "
        "or GSM8K (`#### N` in the reference).",
    )
    builtin: BuiltinTaskSpec = Field(default_factory=BuiltinTaskSpec, description="Built-in task settings.")
    eval_path: PathStr | None = Field(
        None,
        description="Held-out JSONL or Parquet file for evaluation (source `file`); without it, "
        "`evalFraction` of `path`'s records are held out.",
    )
    eval_fraction: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="Without `evalPath`: the fraction of `path`'s records held out for "
        "evaluation (chosen by `splitSeed`, never trained on); 0 disables held-out evaluation.",
    )
    split_seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the train / held-out split of `path`.")
    prompt: Annotated[str, Field(min_length=1, max_length=8192)] | None = Field(
        None,
        description="Prompt template over record fields (Python format syntax, e.g. "
        "`{question}\\nThink step by step.`); without it the `promptKey` field is the prompt.",
    )
    chat: bool = Field(
        False,
        description="Wrap the prompt in the tokenizer's chat template (a user message, "
        "after `system` when set, with the generation prompt).",
    )
    system: Annotated[str, Field(min_length=1, max_length=8192)] | None = Field(
        None, description="System message when `chat` is true."
    )

    @model_validator(mode="after")
    def _path_for_file(self) -> DatasetSpec:
        if self.source == "file" and not self.path:
            raise ValueError("dataset.path is required when dataset.source is 'file'")
        if self.system is not None and not self.chat:
            raise ValueError("dataset.system needs dataset.chat: true (a system message exists only in a chat)")
        return self


class AlgorithmSpec(Spec):
    """The RL algorithm and rollout sampling."""

    name: Literal["grpo"] = Field("grpo", description="RL algorithm.")
    steps: int = Field(20, ge=1, le=1_000_000, description="RL steps to run.")
    prompts_per_step: int = Field(8, ge=1, le=65536, description="Prompts sampled per step.")
    group_size: int = Field(8, ge=2, le=1024, description="Responses per prompt (GRPO group).")
    learning_rate: float = Field(1e-5, gt=0, le=1.0, description="Policy AdamW learning rate.")
    clip_ratio_low: float = Field(0.2, ge=0, le=1.0, description="PPO clip epsilon below 1.")
    clip_ratio_high: float = Field(0.2, ge=0, le=10.0, description="PPO clip epsilon above 1.")
    kl_coef: float = Field(0.0, ge=0, le=10.0, description="KL-to-reference coefficient; 0 disables it.")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "token-mean", description="How per-token losses are aggregated."
    )
    ppo_epochs: int = Field(1, ge=1, le=16, description="Passes over each step's rollouts.")
    micro_batch_size: int = Field(16, ge=1, le=4096, description="Sequences per forward in the update.")
    update_layout: Literal["sorted", "packed", "padded"] = Field(
        "sorted",
        description="Update forwards: sorted (length-sorted micro-batches, each padded to its own longest), packed "
        "(the same micro-batches, each one row with restarting positions, no padding) or padded (batch order).",
    )
    temperature: float = Field(1.0, ge=0, le=10.0, description="Rollout sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1.0, description="Rollout nucleus sampling mass.")
    max_new_tokens: int = Field(512, ge=1, le=131072, description="Response length cap (truncation).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of sampling, shuffling and initialisation.")
    eval_every: Annotated[int, Field(ge=0, le=1_000_000)] | None = Field(
        None,
        description="Held-out evaluation every this many steps and after the last (the dataset's eval split: "
        "reward and accuracy in the metrics, the report and the status); 0: never; unset: after the last step "
        "when the dataset is a file with an eval split (evalPath, or evalFraction > 0), else never.",
    )
    eval_samples: int = Field(64, ge=1, le=100_000, description="Held-out problems evaluated (the eval split's first).")
    eval_temperature: float = Field(0.0, ge=0, le=10.0, description="Held-out sampling temperature; 0 is greedy.")
    rollout: RolloutModeSpec = Field(
        default_factory=RolloutModeSpec,
        description="When a step's rollout ends: sync (every response, on-policy) or partial rollouts.",
    )


class RoleSpec(Spec):
    """The pods of one role."""

    replicas: int = Field(1, ge=0, le=1024, description="Pods of this role.")
    image: Annotated[str, Field(min_length=1, max_length=512, pattern=IMAGE_PATTERN)] = Field(
        "ghcr.io/tlt-dev/tlt-worker:0.1.0",
        description="Container image: [registry[:port]/]path[:tag][@sha256:digest], lowercase path, no spaces.",
    )
    resources: Resources = Field(default_factory=Resources, description="Requests and limits of each pod.")
    pod_template: PodOverrides = Field(default_factory=PodOverrides, description="Pod-template overrides.")


class VerifierSpec(RoleSpec):
    """The reward verifier pods and the reward they compute."""

    reward: Annotated[str, Field(max_length=253, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")] | None = Field(
        None,
        description="Reward plug-in `module:function`, called as function(prompt, response, record) -> float "
        "(importable where verifiers run); without it `dataset.answerFormat` decides the reward.",
    )


class PolicySpec(RoleSpec):
    """The policy pods: rank 0 runs the Ray head and the coordinator, so there is at least one."""

    replicas: int = Field(1, ge=1, le=1024, description="Pods of this role (rank 0 is the coordinator).")
    sharding: Literal["none", "ddp", "fsdp"] | None = Field(
        None,
        description="How the policy update is shared by the policy ranks (one a GPU, one a pod on the CPU: "
        "replicas x max(1, resources.gpus)): fsdp (FSDP2, weights, gradients and optimizer state sharded), ddp "
        "(replicated, gradients averaged) or none (one rank updates alone). Unset: fsdp above one rank.",
    )

    reshard_after_forward: bool = Field(
        True,
        description="fsdp: free each layer's gathered weights after its forward and gather them again for its "
        "backward (the least memory); false keeps them from the forward through the backward of each pass "
        "(one all-gather a pass fewer: faster, the full weights held during a pass).",
    )

    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the update's backward instead of keeping them "
        "from its forward: less memory a rank, one more forward of every layer.",
    )

    @property
    def world(self) -> int:
        """Ranks of the policy group: one a GPU (one a pod without GPUs); 1 with `sharding: none`."""
        return 1 if self.sharding == "none" else self.replicas * max(1, self.resources.gpus)

    @property
    def group_sharding(self) -> str:
        """The sharding the group runs: `none` at one rank, `fsdp` where unset."""
        return "none" if self.world == 1 else (self.sharding or "fsdp")


class RolloutSpec(RoleSpec):
    """The rollout pods and how their engine runs."""

    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Compiled decode/verify steps (torch.compile): on, off, or auto (on for policies of "
        ">= 16 decoder layers, where it was measured to pay back its compile cost; off otherwise).",
    )
    engine: Literal["tlt", "vllm"] = Field(
        "tlt",
        description="Rollout engine: tlt (this project's engine, adaptive SD) or vllm (the optional extra "
        "`pip install 'tlt[vllm]'`; EAGLE SD with the run's drafter, see docs/vllm.md).",
    )


# Prometheus names: a metric is letters, digits, '_' and ':' not starting with a digit; a label the same
# without ':'.
PromMetric = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")]
PromLabel = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]


class MonitoringSpec(Spec):
    """Where the run's metrics go (`loggers`, `metrics_port`) and where the operator reads per-pod GPU
    utilisation (the rest)."""

    loggers: list[Literal["jsonl", "tensorboard", "prometheus", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["jsonl"],
        max_length=5,
        description="Metric backends of the coordinator (tlt.monitoring): jsonl (always on, <out>/metrics.jsonl), "
        "tensorboard (<out>/tensorboard), prometheus (serves /metrics on metricsPort), wandb, mlflow (their "
        "libraries' own environment variables: WANDB_PROJECT, MLFLOW_TRACKING_URI, ...).",
    )
    metrics_port: int = Field(
        8080,
        ge=1024,
        le=65535,
        description="Port of the coordinator's Prometheus /metrics: the pods' container "
        "port 'metrics', the run Service's and NetworkPolicy's metrics port.",
    )

    @model_validator(mode="after")
    def _metrics_port_free(self) -> MonitoringSpec:
        if self.metrics_port in (GCS_PORT, RAY_CLIENT_PORT):
            raise ValueError(MSG_METRICS_PORT)
        return self

    prometheus_url: Annotated[str, Field(max_length=1024, pattern=r"^https?://")] | None = Field(
        None,
        description="Prometheus base URL for per-pod GPU utilisation, read only when it is in the operator's "
        "allowlist (TLT_OPERATOR_PROMETHEUS_URLS, set by the cluster admin); empty: reported state only.",
    )
    gpu_util_metric: PromMetric = Field("DCGM_FI_DEV_GPU_UTIL", description="Utilisation metric (0-100).")
    pod_label: PromLabel = Field("exported_pod", description="Label holding the pod name.")
    namespace_label: PromLabel = Field("exported_namespace", description="Label holding the namespace.")
    poll_seconds: int = Field(10, ge=1, le=3600, description="How often the operator queries.")


class RunSpec(Spec):
    """Spec of one `TLTTrainingRun`."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    policy: PolicySpec = Field(default_factory=PolicySpec, description="GRPO update pods; rank 0 runs the coordinator.")
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="Rollout engine pods (drafter-trainer slots)."
    )
    verifier: VerifierSpec = Field(default_factory=VerifierSpec, description="Reward verifier pods (CPU).")
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    drafter: DrafterSpec = Field(default_factory=DrafterSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    suspend: bool = Field(False, description="Delete the run's pods and keep its state; false resumes.")
    managed_by: Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$")] = Field(
        "tlt.dev/operator", description="Controller that reconciles this run; another value: TLT leaves it alone."
    )
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    scheduling_policy: SchedulingPolicy = Field(default_factory=SchedulingPolicy)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)

    @model_validator(mode="after")
    def _policy_ranks_fed(self) -> RunSpec:
        sequences = self.algorithm.prompts_per_step * self.algorithm.group_size
        if self.policy.world > sequences:
            raise ValueError(
                f"policy: {self.policy.world} policy ranks (replicas x max(1, resources.gpus)) but a step has "
                f"{sequences} sequences (algorithm.promptsPerStep x groupSize); each rank needs one: fewer ranks, "
                "more sequences, or policy.sharding: none"
            )
        if self.algorithm.rollout.partial and self.rollout.engine == "vllm":
            raise ValueError(MSG_PARTIAL_VLLM)
        return self


# KubeRay's rule for a run's name: a DNS-1035 label of at most 53 characters, so every child name
# (`<run>-rollout-<rank>`, the Service `<run>`, hostnames under it) stays a valid name.
RUN_NAME_MAX = 53
RUN_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MSG_RUN_NAME = (
    f"metadata.name must be at most {RUN_NAME_MAX} characters of lowercase letters, digits and '-', "
    "starting with a letter and ending with a letter or digit (DNS-1035, so every child name fits)"
)
RunName = Annotated[str, Field(min_length=1, max_length=RUN_NAME_MAX, pattern=RUN_NAME_PATTERN)]


# `generateName`: the server appends 5 characters, so the prefix leaves room for them within RUN_NAME_MAX.
GENERATED_SUFFIX = 5
RunNamePrefix = Annotated[
    str, Field(min_length=1, max_length=RUN_NAME_MAX - GENERATED_SUFFIX, pattern=r"^[a-z][-a-z0-9]*$")
]


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: RunName = "tlt-run"
    generate_name: RunNamePrefix | None = Field(None, alias="generateName")
    namespace: Name | None = None
    labels: dict[QualifiedName, LabelValue] | None = None  # typed as the apiserver types them
    annotations: dict[QualifiedName, str] | None = None

    @model_validator(mode="after")
    def _generated_name(self) -> ObjectMeta:
        """Only `generateName`: the server will name the run; locally it is the prefix without its '-'."""
        if "name" not in self.model_fields_set and self.generate_name:
            self.__dict__["name"] = self.generate_name.rstrip("-")  # not marked as given: `shown_name` tells
        return self

    @property
    def shown_name(self) -> str:
        """The name as the file gives it: `prefix-*` where the server will complete it."""
        if "name" not in self.model_fields_set and self.generate_name:
            return f"{self.generate_name}* (generateName: the server adds {GENERATED_SUFFIX} characters)"
        return self.name


class TLTTrainingRun(BaseModel):
    """A full manifest: what `kubectl apply -f run.yaml` and `tlt train run.yaml` both take."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["tlt.dev/v1alpha1"] = Field("tlt.dev/v1alpha1", alias="apiVersion")
    kind: Literal["TLTTrainingRun"] = "TLTTrainingRun"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: RunSpec = Field(default_factory=RunSpec)
    status: dict | None = None
