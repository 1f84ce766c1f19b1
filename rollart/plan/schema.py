"""The plan a user writes: cluster, model, task mix, placement, algorithm, weight sync.

Every field a user can write is declared here (pydantic v2, unknown fields rejected).
Cross-field rules (pools that must exist, GPU budgets, divisibility) are checked in
:meth:`Plan._cross_checks` and reported as ``field.path: what is wrong; what is allowed``.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from functools import cached_property
from typing import Annotated, Any, Iterator, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from rollart.plan.distributions import Constant, Distribution, coerce_distribution
from rollart.plan.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS, canonical_gpu, canonical_model

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Probability = Annotated[float, Field(ge=0, le=1)]

MODES = ("sync", "sync+", "one-off", "areal", "rollart")
Mode = Literal["sync", "sync+", "one-off", "areal", "rollart"]


# Upper bounds on counts a user writes: far above any real cluster or run, low enough that a
# typo (batch_size: 1000000) is an error naming the field instead of an hour-long simulation.
Count = Annotated[int, Field(gt=0, le=1_000_000)]
# A simulation that would handle more generation requests than this is refused with its
# estimate (about an hour of wall time at the simulator's ~3-12 k requests/s on one core);
# ROLLART_MAX_SIM_REQUESTS raises (or, in tests, lowers) it.
MAX_SIM_REQUESTS = 20_000_000
# --scale-approx simulates 1/m of the requests, so the guard is m times wider while it loads
_SIM_REQUEST_SCALE: ContextVar[float] = ContextVar("sim_request_scale", default=1.0)


@contextmanager
def sim_request_scale(m: float) -> Iterator[None]:
    """Widen the simulated-requests guard ``m``-fold (``math.inf``: off) for plans built inside."""
    token = _SIM_REQUEST_SCALE.set(m)
    try:
        yield
    finally:
        _SIM_REQUEST_SCALE.reset(token)
PROBLEM_SEPARATOR = "\x1e"  # between the cross-field problems of one ValueError


class _Strict(BaseModel):
    # allow_inf_nan=False: .inf / .nan anywhere is "Input should be a finite number"
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---------------------------------------------------------------- cluster


class GpuType(_Strict):
    """Datasheet numbers of a GPU: dense BF16 TFLOP/s, HBM TB/s, memory in GB as datasheets
    write it (GiB, as vendors mean it) and what the driver leaves visible of it, NVLink GB/s (bytes, both
    directions together, as datasheets write it), dense FP8 TFLOP/s where its tensor cores
    compute FP8."""

    tflops_bf16: PosFloat
    hbm_tbps: PosFloat
    memory_gb: PosFloat
    memory_visible_gib: PosFloat | None = Field(None, description=(
        "GiB of memory the CUDA driver reports (torch.cuda.get_device_properties(0).total_memory), the total "
        "that vLLM's gpu_memory_utilization and a trainer's state must fit in; a little under memory_gb, "
        "whose remainder the driver and ECC keep; unset: memory_gb read as GiB"))
    nvlink_gbps: PosFloat = 400.0
    tflops_fp8: PosFloat | None = Field(None, description=(
        "dense FP8 tensor-core TFLOP/s (no sparsity); unset: no FP8 tensor cores, so FP8 weights are read as "
        "1 byte and computed in BF16 (weight-only)"))
    nvlink_domain: Count = Field(8, description=(
        "GPUs that share one NVLink/NVSwitch domain: a tensor-, expert- or data-parallel group of at most this "
        "many GPUs communicates over NVLink (nvlink_gbps), a wider one crosses the cluster's network. 8 for an "
        "HGX board (H100, H200, H800, H20, A100, B200), 72 for a GB200/GB300 NVL72 rack (the GB200 preset). A pool whose count is not a "
        "multiple of it ends in a partial domain. Groups are laid out as consecutive GPUs from a domain boundary "
        "(a generation group's workers, tp GPUs each; the trainer's tp and ep groups over its GPUs): one that "
        "straddles two domains (tp 16 on GPUs 64-79 of 72-GPU racks) crosses the network too; the trainer's "
        "step waits for its worst group, and a straddling engine worker is priced as crossing"))

    @model_validator(mode="after")
    def _visible_within_memory(self) -> "GpuType":
        if self.memory_visible_gib is not None and self.memory_visible_gib > self.memory_gb:
            raise ValueError(f"memory_visible_gib {self.memory_visible_gib:g} exceeds memory_gb {self.memory_gb:g}: "
                             "the driver sees at most the memory the GPU has")
        return self

    @property
    def usable_memory_gib(self) -> float:
        """GiB a process can allocate on one GPU: ``memory_visible_gib``, else ``memory_gb`` as GiB."""
        return self.memory_visible_gib if self.memory_visible_gib is not None else self.memory_gb


class GpuPool(_Strict):
    gpu: str = Field(description="GPU type: a preset (H800, H20, H100, H200, A100, B200, GB200) or a cluster.custom_gpus name")
    count: Count
    cluster: str = Field("inference", description="physical cluster the pool sits in (links between clusters are slow)")
    profile: str | None = Field(None, description="cost profile YAML (from `rollart calibrate fit`), or 'datasheet' "
                                                  "for the roofline; default: the shipped profile of the GPU type "
                                                  "(or of the preset with its FLOP/s and bandwidths), else measured "
                                                  "kernel efficiencies on its datasheet (the preset it is named "
                                                  "after, else H100)")


class CpuPool(_Strict):
    """A CPU pool for envs. A plan that writes no ``cluster.cpu_pools`` gets ``{"env": CpuPool(cores=4096)}``;
    a run bills that implicit pool by the most cores its envs held at once (sim.costs.price), a written
    pool whole."""

    cores: Annotated[int, Field(gt=0, le=100_000_000)]
    # Time an env call spends outside the env itself (the RPC to the env worker, its thread
    # hand-off), added to every reset / step drawn from the task's distributions; `rollart
    # validate` measures it on the machine at hand.
    reset_overhead_s: NonNegFloat = 0.0
    step_overhead_s: NonNegFloat = 0.0
    image_pull_gbps: PosFloat | None = Field(None, description=(
        "the path through which the pool's nodes pull env images (registry, its network), shared "
        "equally by the pulls in flight; unset: pulls are not modelled apart from env.reset"))


class Serverless(_Strict):
    """An autoscaling serverless platform for stateless reward functions."""

    gpu: str = "H800"
    cold_start_s: NonNegFloat = 8.0
    max_concurrency: Count = 64
    per_call_overhead_s: NonNegFloat = 0.03
    scale_down_idle_s: NonNegFloat = 30.0
    instance_concurrency: Count = Field(
        1, description="calls one instance serves at once, continuously batched in one engine (LLM servers on "
        "serverless GPUs, e.g. Modal's concurrent inputs, Ray Serve's max_ongoing_requests); 1: one call per instance")
    billing: Literal["per_request", "instance_time"] = Field(
        "per_request", description="what the platform bills: each call's time plus the cold starts it causes "
        "(pay per request, e.g. on-demand GPU functions billed per execution) or every instance's time from its cold "
        "start until it scales down, idle included (e.g. Modal, RunPod)")
    tp: Count = Field(1, description="GPUs one instance spans (the judge's tensor parallelism); every instance-second "
                      "is billed as tp GPU-seconds")

    @model_validator(mode="after")
    def _instances(self) -> "Serverless":
        if self.instance_concurrency > self.max_concurrency:
            raise ValueError(f"instance_concurrency ({self.instance_concurrency}) cannot exceed max_concurrency "
                             f"({self.max_concurrency}), the calls the platform runs at once")
        return self


class Link(_Strict):
    kind: Literal["tcp", "rdma", "ib", "nvlink", "pcie"]
    # 1 Mb/s to 10 Pb/s (cross_cluster is the aggregate the clusters exchange: thousands of NICs), up to 10 s
    bandwidth_gbps: Annotated[float, Field(ge=0.001, le=1e7)] | None = None
    latency_us: Annotated[float, Field(ge=0, le=1e7)] | None = None

    def _default(self, field: str) -> float:
        """Unset numbers come from the calibrated link table, else the presets."""
        from rollart.calibration.links import calibrated_links

        kind = "nvlink" if self.kind == "nvlink" else self.kind
        return float(calibrated_links().get(kind, {}).get(field, LINK_PRESETS[self.kind][field]))

    @property
    def bytes_per_s(self) -> float:
        gbps = self.bandwidth_gbps if self.bandwidth_gbps is not None else self._default("bandwidth_gbps")
        return gbps * 1e9 / 8

    @property
    def latency_s(self) -> float:
        us = self.latency_us if self.latency_us is not None else self._default("latency_us")
        return us * 1e-6

    @property
    def measured_rate(self) -> bool:
        """The bandwidth is a measured throughput (the calibrated table's NCCL fit, used when the plan
        gives none), not a line rate that a bulk transfer reaches only a share of."""
        if self.bandwidth_gbps is not None:
            return False
        from rollart.calibration.links import calibrated_links

        return calibrated_links().get(self.kind, {}).get("mape_heldout") is not None


def _default_links() -> dict[str, Link]:
    return {"cross_cluster": Link(kind="tcp"), "intra_cluster": Link(kind="ib")}


class Cluster(_Strict):
    gpu_pools: dict[str, GpuPool] = Field(min_length=1)
    custom_gpus: dict[str, GpuType] = Field(default_factory=dict)
    cpu_pools: dict[str, CpuPool] = Field(default_factory=lambda: {"env": CpuPool(cores=4096)})
    serverless: Serverless | None = Field(default_factory=Serverless)
    links: dict[str, Link] = Field(default_factory=_default_links)

    @field_validator("links")
    @classmethod
    def _cross_cluster_is_a_network(cls, links: dict[str, Link]) -> dict[str, Link]:
        cross = links.get("cross_cluster")
        if cross is not None and cross.kind in ("nvlink", "pcie"):
            raise ValueError(f"cross_cluster.kind: {cross.kind} joins GPUs inside one server, not two clusters; "
                             "use tcp, rdma or ib")
        return links

    def gpu_type(self, name: str) -> GpuType:
        """Resolve a GPU name (custom types win over presets of the same name)."""
        if name in self.custom_gpus:
            return self.custom_gpus[name]
        preset = canonical_gpu(name)
        if preset is None:
            raise KeyError(name)
        return GpuType(**GPU_PRESETS[preset])

    def known_gpu(self, name: str) -> bool:
        return name in self.custom_gpus or canonical_gpu(name) is not None


# ---------------------------------------------------------------- model


class ModelSpec(_Strict):
    """Transformer geometry; ``preset`` fills every field not given explicitly."""

    name: str = "custom"
    layers: Annotated[int, Field(gt=0, le=10_000)]
    hidden: Annotated[int, Field(gt=0, le=1_000_000)]
    heads: Annotated[int, Field(gt=0, le=100_000)]
    kv_heads: Annotated[int, Field(gt=0, le=100_000)]
    head_dim: Annotated[int, Field(gt=0, le=100_000)]
    intermediate: Annotated[int, Field(gt=0, le=10_000_000)]
    vocab: Annotated[int, Field(gt=0, le=100_000_000)]
    tied_embeddings: bool = False
    moe_experts: Annotated[int, Field(ge=0, le=100_000)] = 0
    moe_active_experts: Annotated[int, Field(ge=0, le=100_000)] = 0
    # DeepSeek-V3 / Kimi-K2-class geometry. Every default leaves a plain model as it was.
    dense_layers: Annotated[int, Field(ge=0, le=10_000)] = Field(0, description=(
        "MoE only: the first k layers run a dense MLP of width dense_intermediate instead of the MoE layer "
        "(DeepSeek-V3's first_k_dense_replace: 3)"))
    dense_intermediate: Annotated[int, Field(gt=0, le=10_000_000)] | None = Field(None, description=(
        "width of the dense_layers' MLP (DeepSeek-V3: 18432); intermediate when unset. For a MoE model "
        "intermediate is each routed expert's width (moe_intermediate_size)"))
    shared_expert_intermediate: Annotated[int, Field(ge=0, le=10_000_000)] = Field(0, description=(
        "MoE only: total width of the always-active shared-expert MLP of every MoE layer (DeepSeek-V3: "
        "1 shared expert × 2048; Qwen2-57B-A14B: 20480); 0 = none"))
    kv_lora_rank: Annotated[int, Field(ge=0, le=1_000_000)] = Field(0, description=(
        "multi-head latent attention (MLA, DeepSeek-V2/V3): rank of the compressed KV latent the cache holds; "
        "0 = standard (GQA) attention. With MLA head_dim is the q/k 'nope' dim (qk_nope_head_dim) and a token's "
        "cache per layer is kv_lora_rank + qk_rope_head_dim elements shared by all heads (kv_heads unused)"))
    q_lora_rank: Annotated[int, Field(ge=0, le=1_000_000)] = Field(0, description=(
        "MLA: rank of the query's low-rank projection (DeepSeek-V3: 1536); 0 = a plain query projection"))
    qk_rope_head_dim: Annotated[int, Field(ge=0, le=100_000)] = Field(0, description=(
        "MLA: the rotary part of each q/k head, on top of head_dim (DeepSeek-V3: 64); its key is shared by "
        "all heads and cached beside the latent"))
    v_head_dim: Annotated[int, Field(gt=0, le=100_000)] | None = Field(None, description=(
        "MLA: each head's value dim (DeepSeek-V3: 128); head_dim when unset"))
    # What the generation engines serve: linear-layer weights and KV cache in BF16 or FP8 (embeddings
    # and lm_head stay BF16). The trainer's weights are BF16 either way (``weight_bytes``).
    weight_dtype: Literal["bf16", "fp8"] = "bf16"
    kv_dtype: Literal["bf16", "fp8"] = "bf16"
    max_context_tokens: Annotated[int, Field(gt=0, le=10_000_000)] | None = Field(None, description=(
        "the model's context window in tokens; read for reward_model: the LLM judge cuts the trajectory it scores "
        "at it. Unset: 32768, the native window of the Qwen presets (Qwen2.5-7B, Qwen3); DeepSeek-V3's is 131072"))

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, str):
            data = {"preset": data}
        if isinstance(data, dict) and "preset" in data:
            data = dict(data)
            name = data.pop("preset")
            key = canonical_model(str(name))
            if key is None:
                raise ValueError(f"unknown model preset '{name}'; presets are: {', '.join(MODEL_PRESETS)}")
            data = {"name": key, **MODEL_PRESETS[key], **data}
        return data

    @model_validator(mode="after")
    def _geometry(self) -> "ModelSpec":
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.moe_active_experts > self.moe_experts:
            raise ValueError("moe_active_experts cannot exceed moe_experts")
        if self.dense_layers and not self.moe_experts:
            raise ValueError(f"dense_layers ({self.dense_layers}) needs a MoE model (moe_experts > 0): every "
                             "layer of a dense model is dense already; leave it 0")
        if self.dense_layers >= self.layers and self.moe_experts:
            raise ValueError(f"dense_layers ({self.dense_layers}) must be fewer than layers ({self.layers}): "
                             "a MoE model needs at least one MoE layer")
        if self.dense_intermediate is not None and not self.dense_layers:
            raise ValueError(f"dense_intermediate ({self.dense_intermediate}) is the width of the dense_layers' MLP: "
                             "set dense_layers > 0, or leave it unset")
        if self.shared_expert_intermediate and not self.moe_experts:
            raise ValueError(f"shared_expert_intermediate ({self.shared_expert_intermediate}) needs a MoE model "
                             "(moe_experts > 0); a dense model's MLP width is intermediate")
        if not self.kv_lora_rank:
            for name in ("q_lora_rank", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name):
                    raise ValueError(f"{name} ({getattr(self, name)}) is an MLA field: it needs kv_lora_rank > 0 "
                                     "(0 = standard attention)")
        return self

    # Derived sizes used by every cost model.
    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank`` > 0)."""
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        """Each head's value dim: ``v_head_dim``, else ``head_dim``."""
        return self.v_head_dim or self.head_dim

    @property
    def moe_layers(self) -> int:
        """Layers with a MoE MLP: all but the ``dense_layers`` of a MoE model, none of a dense one."""
        return self.layers - self.dense_layers if self.moe_experts else 0

    @property
    def dense_mlp_width(self) -> int:
        """Width of the dense MLP of the first ``dense_layers`` layers of a MoE model."""
        return self.dense_intermediate or self.intermediate

    @property
    def _uniform(self) -> bool:
        """Every layer alike (the formulas before MLA, shared experts and dense layers existed)."""
        return not (self.mla or self.dense_layers or self.shared_expert_intermediate)

    @property
    def attention_params_per_layer(self) -> int:
        """One layer's attention weights. GQA: Q, K, V, O. MLA: q_a (hidden → q_lora_rank) and q_b
        (→ heads·(head_dim + rope)), or one q projection without q_lora_rank; kv_a (hidden →
        kv_lora_rank + rope); kv_b (kv_lora_rank → heads·(head_dim + v_head_dim)); o (heads·v_head_dim →
        hidden). Norms and a MoE router are not counted (< 0.1 %)."""
        if not self.mla:
            return self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        qk = self.head_dim + self.qk_rope_head_dim
        q = (self.hidden * self.q_lora_rank + self.q_lora_rank * self.heads * qk if self.q_lora_rank
             else self.hidden * self.heads * qk)
        kv_a = self.hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * self.heads * (self.head_dim + self.value_head_dim)
        return q + kv_a + kv_b + self.heads * self.value_head_dim * self.hidden

    def layer_params(self, experts: int) -> list[int]:
        """Each layer's weights (embeddings apart), first to last, with ``experts`` routed experts a MoE
        layer counts (all of them: what it holds; ``moe_active_experts``: what a token runs): attention,
        and a MoE MLP (plus the shared expert) or, in a dense model's every layer and a MoE's first
        ``dense_layers``, the dense MLP."""
        attn = self.attention_params_per_layer
        moe = 3 * self.hidden * (self.intermediate * experts + self.shared_expert_intermediate)
        dense = 3 * self.hidden * self.dense_mlp_width
        first_moe = self.layers - self.moe_layers
        return [attn + (dense if i < first_moe else moe) for i in range(self.layers)]

    def _layer_sum(self, experts: int) -> int:
        """All the layers' weights (embeddings apart) with ``experts`` routed experts a MoE layer counts."""
        return sum(self.layer_params(experts))

    @property
    def params_per_layer(self) -> float:
        """One layer's parameters; the mean over the layers where they differ (MLA, shared experts,
        dense first layers), so ``params`` = layers × this + embeddings either way."""
        if self._uniform:
            attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
            mlp = 3 * self.hidden * self.intermediate * max(1, self.moe_experts)
            return attn + mlp
        return self._layer_sum(self.moe_experts) / self.layers

    @property
    def active_params_per_layer(self) -> float:
        """One token's parameters in one layer (``moe_active_experts`` routed experts, the shared
        expert, a dense layer's MLP); the mean over the layers where they differ."""
        if self._uniform:
            attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
            return attn + 3 * self.hidden * self.intermediate * max(1, self.moe_active_experts)
        return self._layer_sum(max(1, self.moe_active_experts)) / self.layers

    @property
    def params(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if not self._uniform:
            return self._layer_sum(self.moe_experts) + emb
        return self.layers * self.params_per_layer + emb

    @property
    def active_params(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if not self._uniform:
            return self._layer_sum(max(1, self.moe_active_experts)) + emb
        return self.layers * self.active_params_per_layer + emb

    @property
    def weight_bytes(self) -> int:
        return 2 * self.params  # BF16

    @property
    def kv_elements_per_token_layer(self) -> int:
        """KV-cache elements one token holds in one layer: K and V of every KV head (GQA), or MLA's
        latent plus its rotary key (kv_lora_rank + qk_rope_head_dim), one copy for all the heads."""
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        if self.mla:
            return self.layers * self.kv_elements_per_token_layer * (1 if self.kv_dtype == "fp8" else 2)
        return 2 * self.layers * self.kv_heads * self.head_dim * (1 if self.kv_dtype == "fp8" else 2)  # K and V


# ---------------------------------------------------------------- tasks


class EnvSpec(_Strict):
    """Latency and reliability of one environment type."""

    reset: Distribution = Field(description="seconds per env.reset")
    step: Distribution = Field(description="seconds per env.step")
    failure_prob: Probability = 0.0
    timeout_s: PosFloat = 600.0
    max_retries: Annotated[int, Field(ge=0, le=100)] = 1
    retry_backoff_s: NonNegFloat = Field(1.0, description="wait before retry k of a failed call: "
                                         "retry_backoff_s × 2^(k−1) (env.reset's; env.step's too unless "
                                         "step_retry_backoff_s is set)")
    step_retry_backoff_s: NonNegFloat | None = Field(
        None, description="the same for a failed env.step (re-running a command in a live sandbox is not "
                          "starting a new one); retry_backoff_s when omitted")
    cpu_cores: PosFloat = Field(1.0, description=(
        "cores one env reserves for its whole episode, from reset to close, LLM turns included (a container's "
        "CPU request): a pool holds at most cores ÷ cpu_cores envs at once, however idle they are"))
    pool: str | None = Field(None, description="CPU pool; the first one when omitted")
    image_gb: NonNegFloat = Field(0.0, description=(
        "GB an env pulls before its first reset (its image's layers missing from the node), through its "
        "pool's image_pull_gbps; env.reset then draws the rest (container start, setup)"))
    image_cache_hit: Probability = Field(0.0, description="share of images (one per GRPO group: its "
                                         "members share a prompt, so one repository image) a node or "
                                         "registry cache already holds (no pull); no effect while image_gb "
                                         "is 0 (the run says so)")

    @field_validator("reset", "step", mode="before")
    @classmethod
    def _number_is_constant(cls, v: Any) -> Any:
        return coerce_distribution(v)


DEFAULT_RULE_REWARD_S = 0.005  # a regex or answer check on the CPU


class TaskSpec(_Strict):
    """One task domain of the multi-task mix."""

    # no dots, colons or whitespace: --set addresses a task by name (tasks.FrozenLake.share) and errors
    # name it on one line
    name: str = Field(pattern=r"^[^\s.:]+$")
    tag: str | None = Field(None, description="hardware-affinity tag; the name when omitted")
    share: PosFloat = Field(description="relative share of the batch's prompt groups")
    turns: Distribution
    prompt_tokens: Distribution = Field(default_factory=lambda: Constant(value=512))
    obs_tokens: Distribution
    response_tokens: Distribution
    max_context_tokens: Annotated[int, Field(gt=0, le=10_000_000)] = 32768
    env: EnvSpec
    reward: Literal["rule", "llm_judge"] = "rule"
    judge_input_tokens: Annotated[int, Field(gt=0, le=10_000_000)] | None = Field(None, description=(
        "tokens the LLM judge reads per call for this task (llm_judge only): unset, the whole trajectory (prompt, "
        "every turn, the answer, chains of thought included) up to the judge's window; set it where the judge "
        "prompt holds less, e.g. the question, a reference answer and the final answer"))
    rule_reward_s: Distribution = Field(
        default_factory=lambda: Constant(value=DEFAULT_RULE_REWARD_S),
        description="seconds a rule reward takes, its env holding its cores meanwhile: a regex or answer check "
                    "is milliseconds, running a repository's tests (SWE) tens of seconds; the simulator's "
                    "(a real run times its reward functions)")

    @property
    def rule_reward_time_set(self) -> bool:
        """Whether the plan gives this task a rule-reward time other than the default."""
        return self.rule_reward_s != Constant(value=DEFAULT_RULE_REWARD_S)

    @model_validator(mode="after")
    def _rule_reward_time_needs_a_rule(self) -> "TaskSpec":
        if self.reward != "rule" and self.rule_reward_time_set:
            raise ValueError("rule_reward_s is a rule reward's time; this task's reward is llm_judge (priced by "
                             "the reward model): drop rule_reward_s or set reward: rule")
        if self.reward == "rule" and self.judge_input_tokens is not None:
            raise ValueError("judge_input_tokens is what the LLM judge reads; this task's reward is rule: drop "
                             "judge_input_tokens or set reward: llm_judge")
        return self

    def judge_reads(self, context_tokens: int) -> int:
        """The tokens the LLM judge reads for a trajectory of ``context_tokens``, before its window cuts them:
        ``judge_input_tokens`` where set, else the whole trajectory."""
        return self.judge_input_tokens if self.judge_input_tokens is not None else context_tokens

    @field_validator("turns", "prompt_tokens", "obs_tokens", "response_tokens", "rule_reward_s", mode="before")
    @classmethod
    def _number_is_constant(cls, v: Any) -> Any:
        return coerce_distribution(v)

    @property
    def affinity_tag(self) -> str:
        return self.tag or self.name

    def draw_prompt_tokens(self, rng: np.random.Generator) -> int:
        """One draw of a first prompt's tokens from ``prompt_tokens``, rounded to a whole token, at least one."""
        return max(1, round(self.prompt_tokens.sample(rng)))


# ---------------------------------------------------------------- placement


class TrainerPlacement(_Strict):
    pool: str
    gpus: Count
    tp: Count = 1
    pp: Count = 1
    cp: Count = Field(1, description=(
        "context-parallel ranks (Megatron's context_parallel_size): each sequence is split over cp GPUs, tp apart "
        "(the order tp-cp-dp-pp), which hold 1/cp of its tokens and their activations and pass their keys and "
        "values round a ring for causal attention (overlapped with the attention they compute); a data-parallel "
        "rank is tp·cp·pp GPUs. What lets a long context train without a wide tp or refusing for memory"))
    mfu: Annotated[float, Field(gt=0, le=1)] = Field(0.16, description=(
        "model-FLOPs utilisation of the GEMMs (causal attention runs at attention_efficiency × it; the default "
        "0.16 is fitted on H800 to the paper's SWE step, an agentic GRPO step's training 23 % of 366 s, "
        "calibration/tasks/swe-fit.md; Megatron pretraining reaches 0.35-0.45; moved to another GPU type by the "
        "GEMM rule of mfu_measured_on), of "
        "the compute alone: the tensor-parallel all-reduces are priced beside it "
        "(on the GPUs' NVLink inside the GPU type's NVLink domain, nvlink_domain; on the intra-cluster link for "
        "a group wider than the domain or straddling two), so an end-to-end MFU measured at tp > 1 counts them "
        "twice. It is the trainer GPU's own unless mfu_measured_on names another GPU type"))
    mfu_measured_on: str | None = Field(None, description=(
        "the GPU type (a preset or a cluster.custom_gpus name) mfu was measured or fitted on. On a trainer pool of "
        "another type the MFU used is mfu × e_max(trainer GPU) / e_max(this GPU), each the e_max of the BF16 gemm "
        "fit in the kernel profile that type is priced with (H20 0.951; H800, H100, H200 0.772; A100 0.725: an H800 "
        "MFU of 0.16 is 0.197 on H20), capped at 1; a lower bound of the change (non-GEMM kernels are relatively "
        "cheaper on a GPU of fewer FLOP/s too). Unset: a stated mfu is the trainer GPU's own, and the default (0.16, "
        "fitted on H800) moves from H800 by the same rule on a named GPU type (GB200 0.137, H20 0.197)"))
    attention_efficiency: Annotated[float, Field(gt=0, le=2)] = Field(0.52, description=(
        "the rate training's causal attention kernels (flash attention forward and backward) reach in model "
        "FLOPs, as a share of the rate the MFU gives the GEMMs: attention FLOPs grow with the square of a "
        "sequence's length and run slower than the GEMMs, so a long sequence costs more per token than the "
        "MFU alone says. 0.52: Megatron-core with TransformerEngine's fused attention on H100 (NeMo 24.03, "
        "Llama-2-7B, 4K-64K: attention 232 TFLOP/s, the GEMMs 45 % of peak); FlashAttention-2 stacks measure "
        "about 0.27 (llm-foundry MPT-7B/13B BF16 on H100)"))
    micro_batches: Count | None = Field(None, description=(
        "micro-batches a data-parallel rank splits its sequences into (gradient accumulation over them). Unset: one "
        "sequence a micro-batch, as ROLL's Megatron configs train long agentic sequences (micro_batch_size 1), so a "
        "rank runs as many micro-batches as it has sequences. Set: a micro-batch holds ceil(sequences / "
        "micro_batches) sequences, the rank runs ceil(sequences / that) micro-batches, and the memory check counts "
        "that many longest sequences' activations (at ceil(algorithm.batch_size / dp) sequences a rank). The "
        "pipeline bubble is (pp − 1) / (m + pp − 1) of a rank's time at m micro-batches: set below pp, most of it"))
    ep: Count | None = Field(None, description=(
        "expert-parallel ranks a MoE trainer shards its experts over (each GPU holds 1/ep of them and every MoE "
        "layer sends its tokens to their experts' GPUs and back); default the widest inside one NVLink domain: the "
        "largest ep ≤ the trainer GPU type's nvlink_domain (8 on HGX boards) dividing the experts and gpus / pp "
        "whose groups of ep consecutive GPUs straddle no domain boundary (ep 8 on 128 GPUs of 72-GPU racks)"))
    profile: str | None = Field(None, description="measured train profile YAML (written by `rollart validate`): "
                                                  "step time and weight hand-off instead of the FLOPs/MFU model")
    # the cluster.custom_gpus entry mfu_measured_on names, attached by the plan's checks (trainer_split_problems)
    _measured_on_custom: GpuType | None = PrivateAttr(None)

    def measured_on_gpu(self) -> GpuType | None:
        """The GPU type ``mfu_measured_on`` names (a cluster.custom_gpus entry the plan's checks found, else a
        preset); None when unset."""
        if self.mfu_measured_on is None:
            return None
        if self._measured_on_custom is not None:
            return self._measured_on_custom
        preset = canonical_gpu(self.mfu_measured_on)
        if preset is None:
            raise ValueError(f"placement.trainer.mfu_measured_on: unknown GPU type '{self.mfu_measured_on}'")
        return GpuType(**GPU_PRESETS[preset])

    @property
    def rank_gpus(self) -> int:
        """GPUs of one data-parallel rank: tp · cp · pp (one model replica, its sequences split over cp)."""
        return self.tp * self.cp * self.pp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: gpus / (tp · cp · pp), at least one."""
        return max(1, self.gpus // self.rank_gpus)

    def ep_problems(self, model: ModelSpec) -> list[str]:
        """One-line plan errors for an explicit ``ep`` the model or the placement cannot take."""
        if self.ep is None or self.ep == 1:
            return []
        if not model.moe_experts:
            return [f"placement.trainer.ep: {self.ep} expert-parallel ranks, but {model.name} is dense (no experts "
                    "to shard); leave it unset"]
        stage = self.gpus // self.pp  # expert-parallel ranks are carved out of one pipeline stage's GPUs
        out = []
        if stage % self.ep:
            out.append(f"placement.trainer.ep: {self.ep} does not divide the trainer's {stage} GPUs a pipeline "
                       "stage (gpus / pp)")
        if model.moe_experts % self.ep:
            out.append(f"placement.trainer.ep: {self.ep} does not divide the model's {model.moe_experts} experts")
        return out


# An engine's fixed cost a step on a kernel-profile-priced pool (scheduling, sampling, what the CUDA graph does
# not hide): unset, the profile's assumed iteration_overhead_s (3 ms, vLLM 0.8); set it to the engine's own
StepOverheadMs = Annotated[float | None, Field(None, ge=0, le=1000, description=(
    "the engine's fixed milliseconds a step (scheduling, sampling, launches a CUDA graph does not hide) where a "
    "kernel profile prices the GPUs: unset, the profile's assumed 3 ms (vLLM 0.8; the datasheet roofline, "
    "profile: datasheet, assumes 4 ms); an engine with less host work a step (SGLang, ~1.5 ms) sets its own. An "
    "engine profile measured its own and refuses it"))]


class GenerationGroup(_Strict):
    pool: str
    workers: Count
    tp: Count = 1
    max_num_seqs: Count = 256
    role: Literal["both", "prefill", "decode"] = "both"
    ep: Count = Field(1, description="expert-parallel ranks per worker (MoE): its tp GPUs split into ep ranks that "
                      "each run attention for 1/ep of the sequences and hold 1/ep of the experts")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = Field(0.90, description=(
        "share of each GPU's memory the engine may use (vLLM's gpu_memory_utilization): weights, activations and "
        "the KV cache; what is left after weights and activations holds the KV cache. 0.90 is vLLM's default; "
        "ROLL's agentic example configs set 0.8"))
    step_overhead_ms: StepOverheadMs = None


class RewardPlacement(_Strict):
    where: Literal["serverless", "dedicated"] = "serverless"
    pool: str | None = None
    gpus: NonNegInt = 0
    tp: PosInt = 1
    max_num_seqs: Count = Field(256, description=(
        "judge calls one dedicated judge engine serves at once (a continuous-batching server); 1 = one call at a "
        "time, as ROLL's LLMJudgeRewardWorker scores its shard of a batch sample by sample"))
    output_tokens: Annotated[int, Field(gt=0, le=32_768)] = Field(64, description=(
        "tokens the LLM judge writes per call, dedicated or serverless (assumed: a short verdict; ROLL's Qwen2.5-7B "
        "RLVR judge prompt asks for a bare YES or NO, about 2)"))
    step_overhead_ms: StepOverheadMs = None


class Placement(_Strict):
    trainer: TrainerPlacement
    generation: list[GenerationGroup] = Field(min_length=1)
    hw_affinity: dict[str, str] = Field(default_factory=dict)
    pd_disaggregation: bool = False
    prefix_cache: bool = True
    reward: RewardPlacement = Field(default_factory=RewardPlacement)
    colocated: bool = Field(False, description="trainer and the generation workers on its pool time-share the same "
                            "GPUs: each train step offloads the engines and onloads the trainer, and back")

    def shares_trainer_gpus(self, pool: str) -> bool:
        """Generation workers on ``pool`` time-share the trainer's GPUs (colocated placement)."""
        return self.colocated and pool == self.trainer.pool

    def gpus_by_pool(self) -> dict[str, int]:
        """GPUs the placement takes from each pool it names: generation workers × tp, the trainer's
        (colocated: the trainer time-shares its pool's generation GPUs, so that pool gives the larger
        of the two, once) and dedicated reward GPUs. What validation checks against the pools' counts
        and what a run is billed for."""
        used: dict[str, int] = {}
        for g in self.generation:
            used[g.pool] = used.get(g.pool, 0) + g.workers * g.tp
        t = self.trainer
        used[t.pool] = max(used.get(t.pool, 0), t.gpus) if self.colocated else used.get(t.pool, 0) + t.gpus
        if self.reward.gpus and self.reward.pool is not None:
            used[self.reward.pool] = used.get(self.reward.pool, 0) + self.reward.gpus
        return used


# ---------------------------------------------------------------- algorithm & weight sync


class Algorithm(_Strict):
    batch_size: Count = Field(description="trajectories per training batch")
    group_size: Annotated[int, Field(gt=0, le=10_000)] = 8
    alpha: Annotated[int, Field(ge=0, le=1000)] = 1
    redundancy: Annotated[float, Field(ge=0, le=16)] = 0.0
    steps: Count = 5
    mode: Mode = "rollart"
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    max_refills_per_group: Annotated[int, Field(ge=0, le=1000)] = 16
    reference_kl: bool = Field(True, description=(
        "the train step runs the frozen reference model's forward over the batch for a KL term (GRPO's; ROLL's "
        "agentic pipeline keeps a reference cluster for it): one of the step's two extra forwards beside the "
        "old-policy log-probs, 2·P of its 10·P FLOPs a token. false (a KL coefficient of 0, as DAPO-style recipes "
        "train) drops it. The default trainer MFU was fitted with it on"))
    env_managers: Annotated[int, Field(gt=0, le=100_000_000)] | None = Field(
        None, description="trajectories rolled out at once by the continuous modes (rollart, areal): the env "
                          "managers, ROLL's num_env_groups × group_size, AReaL's max_concurrent_rollouts; "
                          "default one batch's members, batch_size × (1 + redundancy); on env groups, one env group per "
                          "group's members. alpha bounds how stale what they roll out may get, not how many run")
    env_groups: bool = Field(True, description=(
        "the continuous modes' env managers form fixed env groups, one GRPO group's members each, bound to "
        "the tasks by their shares (ROLL's GroupQueue and num_groups_partition): each env manager, once free, "
        "joins its env group's oldest episode still short of members or starts the next one, alpha ahead, and a "
        "batch takes each env group's oldest finished one, so batches "
        "keep the task mix. false: one pool of env managers, and a batch is the oldest finished groups "
        "whatever their task (AReaL's own rollout executor)"))
    max_sim_hours: Annotated[float, Field(gt=0, le=1e6)] = 240.0


class WeightSync(_Strict):
    transport: Literal["nccl_broadcast", "bucketed_store"] = "bucketed_store"
    bucket_mb: Annotated[float, Field(ge=1e-3, le=1e7)] = 1024.0  # 1 KiB … 10 TiB
    link: str = "cross_cluster"
    h2d_gbps: PosFloat = Field(200.0, description="host-to-device copy when swapping pulled weights in")
    bucket_overhead_s: NonNegFloat | None = Field(None, description=(
        "the store's fixed cost per bucket put (registration, metadata round trip, handshake), paid one "
        "bucket after another; unset: on a TCP link the overhead measured through the real Mooncake store's TCP "
        "transport (calibration/data/weight_transfer/measured.yaml: loopback on a 2-core host), on an RDMA/IB "
        "link an assumed 2 ms metadata round trip (no per-transfer socket exchange)"))


# ---------------------------------------------------------------- prices

# Default on-demand prices in US$ per GPU-hour. These are assumptions for comparing plans, not
# quotes; override them per scenario (``prices.gpu_usd_per_hour.H20: 1.2``). Sources (2025
# public list prices, rounded):
# * H100 (SXM, 80 GB): 2.50, the middle of the neocloud on-demand range ($2–3/h: Lambda,
#   RunPod, CoreWeave list prices).
# * H800: 2.50, assumed equal to the H100 it is cut down from (same compute and HBM, less
#   NVLink; sold in China, no public cloud list price).
# * H20: 1.20, assumption: about half an H800, following the roughly 1:2 purchase-price ratio
#   reported for H20 vs H800 servers (no public cloud list price).
# * H200 (141 GB): 3.50, neocloud on-demand list prices ($3.3–4/h).
# * A100 (80 GB): 1.50, neocloud on-demand list prices ($1.2–1.8/h).
# * B200 (180 GB): 5.25, the middle of the $4.50–6.00/h specialised-cloud on-demand range of early
#   2026 (Lyceum's B200 pricing guide, March 2026; Spheron lists $6.03).
# * GB200: 5.25, assumed equal to the B200 (sold as NVL72 racks, no broad per-GPU list price; one
#   neocloud lists $9.08/h for a two-GPU superchip, $4.54 a GPU).
# A GPU type without a price (a custom_gpus entry) only matters when a cost is asked for: the
# simulate summary then shows no cost, and `rollart sweep`/`rollart plan` stop with a plan
# error naming ``prices.gpu_usd_per_hour.<type>``.
DEFAULT_GPU_USD_PER_HOUR: dict[str, float] = {"H800": 2.50, "H20": 1.20, "H100": 2.50, "H200": 3.50, "A100": 1.50,
                                             "B200": 5.25, "GB200": 5.25}


class Prices(_Strict):
    """What the cost figures (cost per step, per 1 000 trajectories, per hour) are priced with."""

    gpu_usd_per_hour: dict[str, NonNegFloat] = Field(
        default_factory=lambda: dict(DEFAULT_GPU_USD_PER_HOUR),
        description="US$ per GPU-hour by GPU type (presets or cluster.custom_gpus names); "
                    "entries given here are merged over the defaults")
    # AWS c7i.large on-demand (us-east-1) is $0.0893/h for 2 vCPU ≈ $0.045 per vCPU-hour; an env
    # "core" is priced as one vCPU, rounded down for sustained/reserved use.
    cpu_core_usd_per_hour: NonNegFloat = Field(0.04, description="US$ per CPU core-hour of the env pools")
    # Modal's H100 list price is $0.001097 per GPU-second (≈ $3.95/h): serverless GPU time costs
    # a premium over a reserved GPU-hour, paid only for billed seconds (which seconds are billed:
    # cluster.serverless.billing; Modal itself bills container time, "instance_time"). The premium
    # scales each GPU type's hourly price, so a cheaper serverless GPU costs less per second.
    serverless_premium: NonNegFloat = Field(1.584, description=(
        "serverless GPU time's price over the GPU type's gpu_usd_per_hour: a billed GPU-second costs "
        "gpu_usd_per_hour × serverless_premium / 3600. 1.584 = 0.0011 × 3600 / 2.50: $0.0011 per GPU-second "
        "(Modal's H100 list price, $0.001097) over the table's $2.50/h for H100 and H800"))
    serverless_usd_per_gpu_second: NonNegFloat | None = Field(None, description=(
        "US$ per billed serverless GPU-second whatever the GPU type; set, it overrides serverless_premium"))

    @field_validator("gpu_usd_per_hour", mode="before")
    @classmethod
    def _merge_defaults(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        merged = dict(DEFAULT_GPU_USD_PER_HOUR)
        for name, price in v.items():
            key = canonical_gpu(str(name)) or str(name)  # preset names are case-insensitive
            merged[key] = price
        return merged

    def gpu_price(self, gpu: str) -> float | None:
        """US$ per hour of one GPU of this type, or None when the table has no price for it."""
        if gpu in self.gpu_usd_per_hour:
            return self.gpu_usd_per_hour[gpu]
        key = canonical_gpu(gpu)
        return self.gpu_usd_per_hour.get(key) if key else None

    def serverless_gpu_second_price(self, gpu: str) -> float | None:
        """US$ per billed serverless GPU-second on ``gpu``: the explicit flat rate if set, else the
        type's hourly price × the premium; None when the table has no price for the type."""
        if self.serverless_usd_per_gpu_second is not None:
            return self.serverless_usd_per_gpu_second
        hourly = self.gpu_price(gpu)
        return None if hourly is None else hourly * self.serverless_premium / 3600


# ---------------------------------------------------------------- the real runtime


class RuntimePool(_Strict):
    """What a logical pool is on the machines at hand: real GPUs, or CPU 'virtual devices'
    (Ray custom resources) so hardware-affinity routing runs for real without a GPU."""

    devices: Literal["cpu", "gpu"] = "cpu"
    count: PosInt = Field(1, description="devices of the pool (Ray resource units)")


class RuntimeSection(_Strict):
    """Settings of `rollart run` (ignored by the simulator)."""

    pools: dict[str, RuntimePool] = Field(default_factory=dict)
    model: ModelSpec | None = Field(None, description="the model actually run (default: the plan's model)")
    engine: Literal["torch", "vllm"] = "torch"
    trainer: Literal["torch", "megatron"] = "torch"
    env_workers: PosInt = 2
    max_new_tokens: PosInt = 48
    temperature: PosFloat = 1.0
    learning_rate: PosFloat = 1e-3
    checkpoint_every: NonNegInt = 0
    weight_store: Literal["mooncake", "ray"] = "mooncake"
    reward_url: str | None = Field(None, description="serverless reward endpoint; a Ray Serve deployment when unset")
    reward_timeout_s: PosFloat = 10.0
    reward_retries: NonNegInt = 2
    inject_env_latency: bool = True
    num_cpus: PosInt | None = None
    max_reward_failure_rate: float = Field(0.2, ge=0.0, le=1.0, description=(
        "stop the run when more than this share of a step's reward calls fail (a failed reward "
        "fails its trajectory, which is refilled; it is never scored 0)"))
    allow_external_listeners: bool = Field(False, description=(
        "let services that cannot bind loopback listen on all interfaces: the Mooncake store's "
        "transfer engine (unauthenticated). Off: weight_store=mooncake falls back to Ray's object store"))


# ---------------------------------------------------------------- the plan


class Plan(_Strict):
    name: str = "unnamed"
    description: str = ""
    cluster: Cluster
    model: ModelSpec
    reward_model: ModelSpec = Field(default_factory=lambda: ModelSpec.model_validate("Qwen2.5-7B"))
    tasks: list[TaskSpec] = Field(min_length=1)
    placement: Placement
    algorithm: Algorithm
    weight_sync: WeightSync = Field(default_factory=WeightSync)
    prices: Prices = Field(default_factory=Prices)
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)

    @model_validator(mode="after")
    def _cross_checks(self) -> "Plan":
        problems = list(_cross_problems(self))
        if problems:  # one record per problem (a user's string may hold a newline)
            raise ValueError(PROBLEM_SEPARATOR.join(p.replace(PROBLEM_SEPARATOR, "\\x1e") for p in problems))
        return self

    # Convenience lookups used by the core and the backends.
    @cached_property
    def tasks_by_name(self) -> dict[str, TaskSpec]:
        return {t.name: t for t in self.tasks}

    def task(self, name: str) -> TaskSpec:
        return self.tasks_by_name[name]

    @property
    def groups_per_batch(self) -> int:
        return self.algorithm.batch_size // self.algorithm.group_size

    def env_pool(self, task: TaskSpec) -> str:
        """The CPU pool ``task``'s envs run on: its ``env.pool``, else the plan's first (a valid plan has one)."""
        return task.env.pool or next(iter(self.cluster.cpu_pools))

    @cached_property
    def llm_judged_tasks(self) -> list[TaskSpec]:
        """The tasks whose trajectories the LLM judge scores (``reward: llm_judge``): none, and no judge runs."""
        return [t for t in self.tasks if t.reward == "llm_judge"]

    @property
    def run_model(self) -> ModelSpec:
        """The model ``rollart run`` runs: ``runtime.model``, else the plan's model."""
        return self.runtime.model or self.model

    @property
    def longest_context_tokens(self) -> int:
        """The tasks' largest context window: the longest sequence an engine must hold and the trainer train."""
        return max(t.max_context_tokens for t in self.tasks)

    def gpu_of_pool(self, pool: str) -> GpuType:
        return self.cluster.gpu_type(self.cluster.gpu_pools[pool].gpu)

    def context_notes(self) -> list[str]:
        """One line per task whose window is past the model's native one (a released preset's model card,
        :data:`NATIVE_CONTEXT_TOKENS`; a model the plan describes states none): the run prices the longer context
        as it is, but the model serves it only with rope scaling, which a buyer should know before reading the
        figures."""
        from rollart.plan.presets import NATIVE_CONTEXT_TOKENS

        native = NATIVE_CONTEXT_TOKENS.get(self.model.name)
        if native is None:
            return []
        return [f"tasks.{t.name}.max_context_tokens={t.max_context_tokens:,} is past {self.model.name}'s native "
                f"{native:,}-token window: the model serves it only with rope scaling (YaRN, factor "
                f"{t.max_context_tokens / native:.3g}); priced as it is" for t in self.tasks
                if t.max_context_tokens > native]


def _cross_problems(plan: Plan) -> list[str]:
    c, p, a = plan.cluster, plan.placement, plan.algorithm
    pools = list(c.gpu_pools)
    pool_list = ", ".join(pools)
    out: list[str] = []
    known = sorted(set(GPU_PRESETS) | set(c.custom_gpus))
    for name, pool in c.gpu_pools.items():
        if pool.profile not in (None, "datasheet") and not Path(pool.profile).is_file():
            out.append(f"cluster.gpu_pools.{name}.profile: no profile file '{pool.profile}' "
                       "(write one with `rollart calibrate fit`, or use 'datasheet')")
        if not c.known_gpu(pool.gpu):
            out.append(f"cluster.gpu_pools.{name}.gpu: unknown GPU type '{pool.gpu}'; "
                       f"known: {', '.join(known)} (or define it under cluster.custom_gpus)")
    if c.serverless is not None and not c.known_gpu(c.serverless.gpu):
        out.append(f"cluster.serverless.gpu: unknown GPU type '{c.serverless.gpu}'; known: {', '.join(known)}")

    def need_pool(path: str, name: str | None) -> None:
        if name not in c.gpu_pools:
            out.append(f"{path}: unknown pool '{name}'; pools are: {pool_list}")

    need_pool("placement.trainer.pool", p.trainer.pool)
    for i, g in enumerate(p.generation):
        need_pool(f"placement.generation.{i}.pool", g.pool)
    tags = {t.affinity_tag for t in plan.tasks}
    for tag, pool in p.hw_affinity.items():
        if tag != "default" and tag not in tags:
            out.append(f"placement.hw_affinity.{tag}: no task has this tag; tags are: {', '.join(sorted(tags))}, default")
        gen_pools = {g.pool for g in p.generation}
        if pool not in c.gpu_pools:
            out.append(f"placement.hw_affinity.{tag}: unknown pool '{pool}'; pools are: {pool_list}")
        elif pool not in gen_pools:
            out.append(f"placement.hw_affinity.{tag}: pool '{pool}' has no generation workers; "
                       f"generation pools are: {', '.join(sorted(gen_pools))}")
    if p.reward.where == "dedicated" or p.reward.gpus:
        if p.reward.where == "dedicated" and p.reward.gpus == 0:
            out.append("placement.reward.gpus: dedicated reward needs at least one GPU")
        if p.reward.gpus:
            need_pool("placement.reward.pool", p.reward.pool)
    needs_judge = bool(plan.llm_judged_tasks)
    if needs_judge and p.reward.where == "serverless" and c.serverless is None:
        out.append("placement.reward.where: 'serverless' but cluster.serverless is not defined")
    if needs_judge:
        out.extend(judge_tp_problems(plan))

    # GPU budget per pool (pools the placement names but the cluster lacks are reported above).
    used = {name: n for name, n in p.gpus_by_pool().items() if name in pools}
    if p.colocated and not any(g.pool == p.trainer.pool for g in p.generation):
        out.append(f"placement.colocated: no generation workers on the trainer's pool '{p.trainer.pool}' to share "
                   "its GPUs with")
    for name, n in used.items():
        if n > c.gpu_pools[name].count:
            out.append(f"cluster.gpu_pools.{name}.count: placement uses {n} GPUs of this pool but it has "
                       f"{c.gpu_pools[name].count} (trainer + generation workers × tp + reward gpus)")

    if p.reward.gpus % p.reward.tp:  # gpus / tp judge engines: a remainder would be billed idle
        out.append(f"placement.reward.gpus: {p.reward.gpus} is not a multiple of placement.reward.tp "
                   f"({p.reward.tp}), the GPUs one judge engine spans")
    if plan.model.max_context_tokens is not None:
        out.append("model.max_context_tokens: read for reward_model only (the judge's window); the policy's "
                   "context is each task's max_context_tokens")
    rank = p.trainer.rank_gpus
    if p.trainer.gpus % rank:
        named = "tp × cp × pp" if p.trainer.cp > 1 else "tp × pp"
        out.append(f"placement.trainer.gpus: {p.trainer.gpus} is not a multiple of {named} = {rank}")
    out.extend(trainer_split_problems(plan))
    out.extend(p.trainer.ep_problems(plan.model))
    for i, g in enumerate(p.generation):
        if plan.model.heads % g.tp:
            out.append(f"placement.generation.{i}.tp: {g.tp} does not divide the model's {plan.model.heads} heads")
        if g.ep > 1 and not plan.model.moe_experts:
            out.append(f"placement.generation.{i}.ep: {g.ep} expert-parallel ranks, but {plan.model.name} is dense "
                       "(no experts to split): set ep 1 or leave it out")
        elif g.ep > 1 and (g.tp % g.ep or plan.model.moe_experts % g.ep):
            out.append(f"placement.generation.{i}.ep: {g.ep} must divide the worker's {g.tp} GPUs (tp) and the model's "
                       f"{plan.model.moe_experts} experts")
    if p.pd_disaggregation:
        roles = {g.role for g in p.generation}
        if "prefill" not in roles or "decode" not in roles:
            out.append("placement.pd_disaggregation: needs generation groups with role 'prefill' and role 'decode'")
    elif any(g.role != "both" for g in p.generation):
        out.append("placement.generation: roles 'prefill'/'decode' need placement.pd_disaggregation: true")

    members = members_per_group(a.group_size, a.redundancy)
    if a.env_managers is not None and a.env_managers < members:
        out.append(f"algorithm.env_managers: {a.env_managers} cannot roll out one group "
                   f"({members} members with redundancy {a.redundancy:g})")
    if a.batch_size % a.group_size:
        out.append(f"algorithm.batch_size: {a.batch_size} is not a multiple of algorithm.group_size ({a.group_size})")
    for name in plan.runtime.pools:
        if name not in c.gpu_pools:
            out.append(f"runtime.pools.{name}: unknown pool '{name}'; pools are: {pool_list}")
    if plan.weight_sync.link not in c.links:
        out.append(f"weight_sync.link: unknown link '{plan.weight_sync.link}'; links are: {', '.join(c.links)}")
    if "cross_cluster" not in c.links:
        out.append("cluster.links: a 'cross_cluster' link is required (trainer ↔ inference across clusters)")

    cpu_pools = list(c.cpu_pools)
    if not cpu_pools:
        out.append("cluster.cpu_pools: at least one CPU pool is needed for the environments")
    names = [t.name for t in plan.tasks]
    for i, t in enumerate(plan.tasks):
        if names.count(t.name) > 1:
            out.append(f"tasks.{i}.name: duplicate task name '{t.name}'")
        if t.env.pool is not None and t.env.pool not in c.cpu_pools:
            out.append(f"tasks.{t.name}.env.pool: unknown CPU pool '{t.env.pool}'; "
                       f"CPU pools are: {', '.join(cpu_pools)}")
        pool = t.env.pool or (cpu_pools[0] if cpu_pools else None)
        if pool in c.cpu_pools and t.env.cpu_cores > c.cpu_pools[pool].cores:
            out.append(f"tasks.{t.name}.env.cpu_cores: {t.env.cpu_cores} exceeds CPU pool '{pool}' "
                       f"({c.cpu_pools[pool].cores} cores)")
        if pool in c.cpu_pools and t.env.image_gb > 0 and c.cpu_pools[pool].image_pull_gbps is None:
            out.append(f"tasks.{t.name}.env.image_gb: CPU pool '{pool}' gives no image_pull_gbps to pull it "
                       f"through; set cluster.cpu_pools.{pool}.image_pull_gbps (or image_gb: 0)")
        if math.isinf(t.turns.mean()):
            out.append(f"tasks.{t.name}.turns: the distribution has no finite mean; cap it with 'max'")
        for field in ("prompt_tokens", "obs_tokens", "response_tokens"):
            m = getattr(t, field).mean()
            if not m <= t.max_context_tokens:
                out.append(f"tasks.{t.name}.{field}: mean {m:.4g} tokens exceeds the task's max_context_tokens "
                           f"({t.max_context_tokens})")
        if not any(p.startswith(f"tasks.{t.name}.prompt_tokens") for p in out) and \
                (share := overlong_prompt_share(t)) > MAX_OVERLONG_PROMPT_SHARE:
            out.append(f"tasks.{t.name}.prompt_tokens: {share:.0%} of its draws leave no room in the task's "
                       f"max_context_tokens ({t.max_context_tokens}); a dataset filtered to prompts that fit would "
                       "hold too few of them: lower the prompts or raise max_context_tokens")
    if not out:
        out.extend(work_problems(plan))
    return out


# The simulator draws a first prompt again while it fills the task's window (the dataset filter RL
# harnesses apply, sim.costs.env._prompt_tokens); a distribution whose draws mostly do is refused.
MAX_OVERLONG_PROMPT_SHARE = 0.5
_OVERLONG_DRAWS = 1024


def overlong_prompt_share(task: "TaskSpec") -> float:
    """Share of ``task.prompt_tokens`` draws (1,024 from a fixed seed) that leave no room in the task's
    window: at or above ``max_context_tokens`` (:meth:`TaskSpec.draw_prompt_tokens`, the simulator's draw)."""
    rng = np.random.default_rng(0)
    window = task.max_context_tokens
    overlong = sum(task.draw_prompt_tokens(rng) >= window for _ in range(_OVERLONG_DRAWS))
    return overlong / _OVERLONG_DRAWS


def trainer_split_problems(plan: Plan) -> list[str]:
    """Megatron splits each attention layer's query heads and KV groups over the trainer's tp ranks, so
    tp must divide both (an MLA model caches no KV groups: its heads only), and gives each pipeline
    stage whole layers, so pp cannot exceed the layers (where pp does not divide them the first stages
    take one more: ``sim.costs.train.stage_layers``). ``mfu_measured_on`` must name a known GPU type; a
    cluster.custom_gpus one is attached to the trainer placement for the cost model."""
    m, t, out = plan.model, plan.placement.trainer, []
    groups = [("heads", m.heads)] + ([] if m.kv_lora_rank else [("KV heads", m.kv_heads)])
    for what, n in groups:
        if n % t.tp:
            out.append(f"placement.trainer.tp: {t.tp} does not divide the model's {n} {what} (Megatron splits them "
                       "over the tensor-parallel ranks); pick a divisor")
            break
    if t.pp > m.layers:
        out.append(f"placement.trainer.pp: {t.pp} pipeline stages for the model's {m.layers} layers; at most "
                   f"{m.layers}")
    c = plan.cluster
    if t.mfu_measured_on is not None:
        if not c.known_gpu(t.mfu_measured_on):
            known = sorted(set(GPU_PRESETS) | set(c.custom_gpus))
            out.append(f"placement.trainer.mfu_measured_on: unknown GPU type '{t.mfu_measured_on}' (the GPU type "
                       f"placement.trainer.mfu was measured on); known: {', '.join(known)} (or define it under "
                       "cluster.custom_gpus)")
        elif t.mfu_measured_on in c.custom_gpus:  # custom types win over presets of the same name (Cluster.gpu_type)
            t._measured_on_custom = c.custom_gpus[t.mfu_measured_on]
    return out


def judge_tp_problems(plan: Plan) -> list[str]:
    """The LLM judge's tensor parallelism must split its heads, as a generation worker's must
    (dedicated: placement.reward.tp; serverless: cluster.serverless.tp)."""
    heads, out = plan.reward_model.heads, []
    tps = [("placement.reward.tp", plan.placement.reward.tp)] if plan.placement.reward.gpus else []
    if plan.cluster.serverless is not None:
        tps.append(("cluster.serverless.tp", plan.cluster.serverless.tp))
    for field, tp in tps:
        if heads % tp:
            out.append(f"{field}: {tp} does not divide the reward model's {heads} heads")
    return out


def members_per_group(group_size: int, redundancy: float) -> int:
    """Trajectories launched per GRPO group: ceil(group_size × (1 + redundancy)), at least the group
    (the epsilon keeps 8 × 1.25 at 10 where floating point lands a hair above)."""
    return max(group_size, math.ceil(group_size * (1.0 + redundancy) - 1e-9))


def env_managers_of(env_managers: int | None, groups_per_batch: int, group_size: int, redundancy: float) -> int:
    """The env managers a continuous mode rolls out with: ``algorithm.env_managers``, by default one
    batch's members (ROLL's count), and never fewer than one group's members."""
    members = members_per_group(group_size, redundancy)
    return max(members, env_managers or groups_per_batch * members)


def sim_requests_estimate(plan: Plan) -> float:
    """About how many generation requests simulating ``plan`` handles: the batches trained plus
    the α batches started ahead, each member launched with its redundancy, times the mean turns."""
    a = plan.algorithm
    share = sum(t.share for t in plan.tasks)
    turns = sum(t.share * max(1.0, t.turns.mean()) for t in plan.tasks) / share
    members = members_per_group(a.group_size, a.redundancy) / a.group_size
    return (a.steps + a.alpha) * a.batch_size * members * turns


def work_problems(plan: Plan) -> list[str]:
    """The simulated-requests guard (see MAX_SIM_REQUESTS), under the current sim_request_scale."""
    scale = _SIM_REQUEST_SCALE.get()
    limit = float(os.environ.get("ROLLART_MAX_SIM_REQUESTS", MAX_SIM_REQUESTS)) * scale
    work = sim_requests_estimate(plan)
    if work <= limit:
        return []
    a = plan.algorithm
    if scale > 1:  # under --scale-approx: the simulated share is what counts
        return [f"algorithm: about {work / scale:.3g} generation requests to simulate with --scale-approx "
                f"(1/{scale:g} of {work:.3g}), over the {limit / scale:.3g} limit (about an hour here); lower "
                "algorithm.steps, batch_size, alpha or redundancy, or raise ROLLART_MAX_SIM_REQUESTS"]
    return [f"algorithm: about {work:.3g} generation requests to simulate ((steps {a.steps} + alpha {a.alpha}) × "
            f"batch_size {a.batch_size} × (1 + redundancy {a.redundancy:g}) × mean turns), over the "
            f"{limit:.3g} limit (about an hour here); lower algorithm.steps, batch_size, alpha or redundancy, "
            "or raise ROLLART_MAX_SIM_REQUESTS (a very large cluster: --scale-approx simulates a share of it)"]
