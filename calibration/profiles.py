"""GPU profiles: fitted cost-model coefficients with their data, assumptions and errors.

Two kinds, both YAML:

* ``kernel`` — per GPU class and model-agnostic: GEMM, prefill/decode attention and
  all-reduce models fitted from kernel timings (``calibration/profiles/<gpu>.yaml``, built by
  ``python -m rollart.calibration.build``). Composed for any model geometry and TP degree.
* ``engine`` — one model on one device measured end to end (``rollart calibrate profile``
  then ``rollart calibrate fit``): prefill(N, A) = a + b·N + c·A and decode(B, X) = a + b·B + c·X.
* ``train`` — one model's training step and weight hand-off measured on one device
  (``rollart validate`` writes it; a trainer placement uses it with ``profile:``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rollart.calibration.kernels import CUSTOM_ALLREDUCE_MAX_BYTES, M_TILE, gemm_on_datasheet

PROFILE_DIR = Path(__file__).parent / "profiles"


class ComponentFit(BaseModel):
    """One fitted model: its formula, coefficients, the data and the errors."""

    model_config = ConfigDict(extra="forbid")

    formula: str
    params: dict[str, float]
    data: list[str] = Field(default_factory=list)
    rows: int = 0
    heldout_rows: int = 0
    mape_train: float | None = None
    mape_heldout: float | None = None
    derived: str | None = Field(None, description="set when not measured on this GPU: how it was derived")
    dtype: str | None = Field(None, description="the operand dtype the term models (kernel profiles)")


class PhaseError(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefill_mape_heldout: float | None
    decode_mape_heldout: float | None
    note: str = ""


class KernelProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["kernel"] = "kernel"
    gpu: str
    peak_tflops_bf16: float
    # the dense FP8 tensor-core peak; None: the tensor cores do not compute FP8 (Ampere and older), so
    # FP8 weights are stored as 1 byte and computed in BF16 (weight-only), whatever FP8 fits it carries
    peak_tflops_fp8: float | None = None
    hbm_tbps: float
    # set on a profile built at run time for a GPU type without one: the GPU whose fitted efficiencies
    # it carries to this datasheet (``transferred_profile``)
    transferred_from: str | None = None
    iteration_overhead_s: float
    gemm: ComponentFit  # BF16 weights; params["e_mem"] is the GPU's weight-read (memory-system) efficiency
    # FP8 weights: the fit of measured FP8 GEMMs, composed as fitted (H20's with e_mem pinned at gemm's
    # memory-system rate, its small-m time on the 64-row tile's compute side). None: not measured.
    gemm_fp8: ComponentFit | None = None
    # MoE expert layers: measured FP8 grouped GEMMs (one launch over the experts holding tokens). The
    # composition scales the dense linear-layer terms by this fit ÷ gemm_fp8 (``grouping_factors``).
    # None: not measured; expert layers are priced as dense GEMMs of their shapes.
    gemm_grouped_fp8: ComponentFit | None = None
    attn_prefill: ComponentFit
    attn_decode: ComponentFit
    # Decode attention over an FP8 KV cache: t0 and e_bw replacing attn_decode's (1 byte per element)
    attn_decode_fp8_kv: ComponentFit | None = None
    # HBM streaming rate of long reads (decode-attention rows of ≥ 1 GB, memory-bound): the evidence
    # for the weight-read rate gemm.e_mem where BF16 GEMMs are not measured. None: older profiles.
    stream: ComponentFit | None = None
    allreduce: ComponentFit
    # The in-engine all-reduce a serving engine uses for tensor-parallel messages up to
    # params["max_bytes"] (vLLM's custom all-reduce: peer-to-peer over NVLink, one kernel, no NCCL
    # launch): the same formula. None: every message priced as ``allreduce`` (NCCL).
    allreduce_custom: ComponentFit | None = None
    fit_error: PhaseError
    assumptions: list[str] = Field(default_factory=list)
    source: str = ""

    @property
    def fp8_tensor_cores(self) -> bool:
        return self.peak_tflops_fp8 is not None

    def terms(self) -> list[tuple[str, ComponentFit]]:
        """(label, fit) of every fitted term the profile holds; a term with ``derived`` set was not
        measured on this GPU."""
        named = (("GEMM bf16", self.gemm), ("GEMM fp8", self.gemm_fp8), ("grouped GEMM fp8 (MoE)", self.gemm_grouped_fp8),
                 ("prefill attention", self.attn_prefill), ("decode attention bf16 KV", self.attn_decode),
                 ("decode attention fp8 KV", self.attn_decode_fp8_kv), ("HBM stream", self.stream),
                 ("all-reduce", self.allreduce), ("custom all-reduce", self.allreduce_custom))
        return [(label, c) for label, c in named if c is not None]


GROUPED_PARAMS = ("t0", "e_max", "m_half", "e_mem")


def stream_efficiency(profile: KernelProfile) -> float:
    """The fraction of the datasheet HBM rate a long memory-bound stream reaches: the ``stream`` fit,
    or decode attention's byte rate in profiles fitted before it."""
    return (profile.stream or profile.attn_decode).params["e_bw"]


def grouping_factors(profile: KernelProfile) -> dict[str, float] | None:
    """How much a grouped GEMM (a MoE layer's experts, one launch) departs from a dense GEMM on this
    GPU: the measured FP8 grouped fit ÷ the measured FP8 dense fit, per parameter. The composition
    applies these factors to the dense linear-layer terms of either dtype (the grouping is the
    kernel's schedule over many small weights, not its arithmetic). Where both fits pin e_mem at the
    memory-system rate (H20) its factor is 1 by construction. None without both fits."""
    if profile.gemm_grouped_fp8 is None or profile.gemm_fp8 is None:
        return None
    g, d = profile.gemm_grouped_fp8.params, profile.gemm_fp8.params
    return {k: g[k] / d[k] for k in GROUPED_PARAMS}


def expert_gemm_params(profile: KernelProfile, linear: dict[str, float], linear_peak: float) -> dict[str, float] | None:
    """The grouped-GEMM terms of a MoE layer's experts in the served dtype, from the dense
    linear-layer terms ``linear`` (fitted at ``linear_peak`` FLOP/s) and the measured FP8 grouped ÷
    dense fits (``grouping_factors``). t0, e_max and e_mem take the factors. The knee is carried as
    time, not rows: grouping adds (m_g/e_g − m_d/e_d) / P8 seconds of tile compute per weight
    element (P8 the FP8 fits' peak), so

        m_half' = e_max' · [m_half / e_max + (linear_peak / P8) · (m_g/e_g − m_d/e_d)]

    which is the grouped fit itself when the linear layers are the FP8 fit. Scaling the rows instead
    would charge a BF16 GEMM, whose fitted knee already sits at its own (half) peak, twice the
    grouping's extra compute. None without both FP8 fits."""
    factors = grouping_factors(profile)
    if factors is None:
        return None
    g, d = profile.gemm_grouped_fp8.params, profile.gemm_fp8.params
    fp8_peak = (profile.peak_tflops_fp8 or 2 * profile.peak_tflops_bf16) * 1e12
    out = {k: linear[k] * factors[k] for k in ("t0", "e_max", "e_mem")}
    out["e_max"], out["e_mem"] = min(1.0, out["e_max"]), min(1.0, out["e_mem"])
    extra = g["m_half"] / g["e_max"] - d["m_half"] / d["e_max"]
    out["m_half"] = max(0.0, out["e_max"] * (linear["m_half"] / linear["e_max"] + linear_peak / fp8_peak * extra))
    return out


def term_lines(profile: KernelProfile) -> list[tuple[str, str, str]]:
    """(term, dtype, derivation) for every term a kernel profile composes: what ``rollart
    calibrate show`` prints, one line each."""
    def how(c: ComponentFit) -> str:
        if c.derived:
            return f"derived: {c.derived}"
        held = f", held-out MAPE {c.mape_heldout:.1%}" if c.mape_heldout is not None else ""
        return f"fitted to {c.rows + c.heldout_rows} measured rows ({', '.join(c.data[:1])}{' …' if len(c.data) > 1 else ''}{held})"

    e_mem = profile.gemm.params.get("e_mem", 1.0)
    # a few-row GEMM still computes max(m_half, M_TILE) rows at e_max: per BF16 weight (2 bytes, 2·rows
    # FLOP) that is P·e_max / rows bytes per second, the small-batch ceiling when below the HBM rate
    read = e_mem * profile.hbm_tbps
    rows = max(profile.gemm.params.get("m_half", 0.0), M_TILE)
    floor = profile.peak_tflops_bf16 * profile.gemm.params.get("e_max", 1.0) / rows
    out = [("linear layers, BF16 weights", profile.gemm.dtype or "bf16",
            how(profile.gemm) + f" → weight reads at e_mem {e_mem:.3g} × {profile.hbm_tbps:g} = {read:.3g} TB/s; a "
            f"few-row GEMM computes at least {rows:.0f} rows at e_max, {floor:.3g} TB/s of weights"
            + (", which binds first at small batch" if floor < read else ""))]
    if profile.gemm_fp8 is not None and profile.fp8_tensor_cores:
        out.append(("linear layers, FP8 weights", profile.gemm_fp8.dtype or "fp8",
                    f"{how(profile.gemm_fp8)}, composed as fitted: weight reads 1 byte each at e_mem "
                    f"{profile.gemm_fp8.params.get('e_mem', 0):.3g}"
                    + (" (pinned at the memory-system rate)" if profile.gemm_fp8.params.get("e_mem") == e_mem
                       else " (the kernel's, measured)")))
    else:
        why = "no FP8 timings" if profile.fp8_tensor_cores else "no FP8 tensor cores"
        out.append(("linear layers, FP8 weights", "fp8 storage, bf16 compute",
                    f"{why}: BF16 compute, weights read 1 byte each at e_mem {e_mem:.3g}"))
    f = grouping_factors(profile)
    if f is not None:
        out.append(("MoE expert layers (grouped GEMM)", "as the linear layers",
                    f"the linear-layer terms × the grouping factors t0 ×{f['t0']:.3g}, e_max ×{f['e_max']:.3g}, "
                    f"e_mem ×{f['e_mem']:.3g} (the FP8 grouped fit, {how(profile.gemm_grouped_fp8)}, ÷ the FP8 dense "
                    "fit), and the grouped fit's extra knee carried as tile time per weight element"))
    else:
        out.append(("MoE expert layers (grouped GEMM)", "as the linear layers",
                    "no grouped-GEMM timings: priced as dense GEMMs of the experts' shapes"))
    out.append(("lm_head", "bf16", "the BF16 GEMM model (not quantised)"))
    out.append(("prefill attention", profile.attn_prefill.dtype or "bf16", how(profile.attn_prefill)))
    out.append(("decode attention, BF16 KV", profile.attn_decode.dtype or "bf16", how(profile.attn_decode)))
    if profile.attn_decode_fp8_kv is not None:
        out.append(("decode attention, FP8 KV", profile.attn_decode_fp8_kv.dtype or "fp8", how(profile.attn_decode_fp8_kv)))
    else:
        out.append(("decode attention, FP8 KV", "fp8 KV cache",
                    "no FP8-KV timings: the BF16-KV kernel's byte rate, 1 byte per element"))
    if profile.stream is not None:
        e = profile.stream.params.get("e_bw", 0.0)
        out.append(("HBM streaming (long reads)", profile.stream.dtype or "bf16",
                    how(profile.stream) + f" → {e:.3g} × {profile.hbm_tbps:g} = {e * profile.hbm_tbps:.3g} TB/s"))
    ew = stream_efficiency(profile) * profile.hbm_tbps
    out.append(("element-wise kernels (norms, rotary, SiLU-and-mul)", "bf16 activations",
                "HBM traffic from the geometry"
                + (" (+ FP8 activation quantisation with FP8 weights)" if profile.fp8_tensor_cores else "")
                + f" at the "
                f"{'long-stream' if profile.stream is not None else 'decode-attention'} rate, {ew:.3g} TB/s; "
                "no kernel timed"))
    out.append(("all-reduce / all-to-all", profile.allreduce.dtype or "bf16 activations", how(profile.allreduce)))
    if profile.allreduce_custom is not None:
        c = profile.allreduce_custom
        limit = c.params.get("max_bytes", CUSTOM_ALLREDUCE_MAX_BYTES) / 2**20
        out.append((f"all-reduce < {limit:g} MiB (engine's custom kernel, at most NCCL's price)",
                    c.dtype or "bf16 activations", how(c)))
    out.append(("iteration overhead", "-", f"assumed {profile.iteration_overhead_s * 1e3:g} ms per engine step"))
    return out


class EngineProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["engine"] = "engine"
    gpu: str
    model: str
    engine: str
    prefill: ComponentFit  # params a, b (per token), c (per attention pair)
    decode: ComponentFit   # params a, b (per sequence), c (per cached token)
    # Time a generate call spends outside the engine's steps (RPC to the worker, its command
    # loop, the reply): added once per request. 0 when only the engine was measured.
    request_overhead_s: float = Field(0.0, ge=0)
    # Engine time of a step during which the worker's event loop handled generate calls (their
    # arrival or the return of their result): that Python runs in the engine's process and takes
    # the GIL from the engine thread for about a switch interval, for one call or several. It
    # delays every request in the batch, unlike request_overhead_s. 0 for engines in their own
    # process or when not measured.
    call_step_s: float = Field(0.0, ge=0)
    # How a step that both prefills and decodes is priced: one fixed cost (one fused forward,
    # as vLLM runs it) or both (separate forwards, as the torch engine runs them).
    mixed_step: Literal["one_fixed_cost", "both_fixed_costs"] = "one_fixed_cost"
    # The decode batch's KV: paged (attention reads each row's own context, X = Σ contexts, as
    # vLLM) or padded to the longest row (X = rows × longest context, as the torch engine).
    kv_layout: Literal["paged", "padded"] = "paged"
    # Measured on CPU virtual devices that share one host: how many compute actors the host runs
    # in parallel, and how many engines ran side by side while the steps were measured (the
    # simulator's HostContention). None for a device of its own.
    host_parallelism: float | None = Field(None, gt=0)
    side_by_side: int = Field(1, ge=1)
    # CPU seconds the run's driver and env workers spend per effect of the core, on the same
    # host: at a high effect rate they take cores from the engines and the trainer.
    effect_cpu_s: float = Field(0.0, ge=0)
    fit_error: PhaseError
    assumptions: list[str] = Field(default_factory=list)
    source: str = ""


class TrainProfile(BaseModel):
    """A trainer measured on one device: step(T, S) = a + b·T + c·S with T the batch's tokens
    and S = Σ s² over its sequences; and the weight hand-off after a step, in seconds."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["train"] = "train"
    gpu: str
    model: str
    trainer: str
    step: ComponentFit
    publish_pull_s: float = Field(ge=0, description="bucketed publish + one worker's pull, measured")
    broadcast_s: float = Field(ge=0, description="synchronous hand-off of the weights to a worker, measured")
    swap_s: float = Field(0.0, ge=0, description="loading pulled weights into an engine, measured")
    assumptions: list[str] = Field(default_factory=list)
    source: str = ""


Profile = KernelProfile | EngineProfile | TrainProfile


def load_profile(path: str | Path) -> Profile:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a profile (a YAML mapping with kind: kernel | engine | train)")
    if data.get("kind") == "engine":
        return EngineProfile.model_validate(data)
    if data.get("kind") == "train":
        return TrainProfile.model_validate(data)
    return KernelProfile.model_validate(data)


def save_profile(profile: Profile, path: str | Path, header: str = "") -> None:
    text = yaml.safe_dump(profile.model_dump(), sort_keys=False, width=100, allow_unicode=True)
    if header:
        text = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + text
    Path(path).write_text(text)


# The GPU whose measured kernel efficiencies price a GPU type without a profile of its own: the H100
# (its BF16 GEMMs timed by Vidur, its attention and FP8 GEMMs the H800's: the same GH100 die)
TRANSFER_REFERENCE = "H100"
# The references a custom GPU type is matched to (calibration.transfer_reference): Hopper timed on either side
# of the roofline's ridge (H100 295, H20 37 BF16 FLOP per HBM byte), Ampere (A100, no FP8 tensor cores), and
# Blackwell (B200, GB200: Hopper's fits at the share of peak Blackwell is measured to sustain,
# calibration.sustained). The H200 profile is itself H100's efficiencies; H800's are H100's bar the BF16 GEMM
# source.
RIDGE_REFERENCES = ("H100", "H20", "A100", "B200", "GB200")


def transferred_profile(reference: KernelProfile, gpu_name: str, tflops_bf16: float, hbm_tbps: float,
                        nvlink_gbps: float, reference_nvlink_gbps: float, tflops_fp8: float | None) -> KernelProfile:
    """``reference``'s measured kernel efficiencies on another GPU's datasheet, as the H200 profile is
    built from the H800's: every fit keeps its fraction of peak FLOP/s or HBM bandwidth (and its
    launch costs), compute-bound kernels scale with ``tflops_bf16``, memory-bound ones with
    ``hbm_tbps``, the all-reduces with NVLink, and a GEMM's knee with a lower peak (see
    :func:`kernels.gemm_on_datasheet`). So a GPU type without kernel timings of its own is
    priced by the same composition as the measured ones, not by the datasheet roofline's assumed
    efficiencies, and a comparison across pools compares datasheets, not two cost models. Without FP8
    tensor cores (``tflops_fp8`` None) FP8 weights compute in BF16 (weight-only)."""
    scale = nvlink_gbps / reference_nvlink_gbps
    how = (f"{reference.gpu}'s fitted efficiency on {gpu_name}'s datasheet ({tflops_bf16:g} TFLOP/s BF16, "
           f"{hbm_tbps:g} TB/s); no {gpu_name} timings")
    # a GEMM's knee moves with the peak it computes at (kernels.gemm_on_datasheet); the FP8 fits are priced
    # only where both GPUs have FP8 tensor cores, else they move with the BF16 peak (their ratios stay)
    knee_bf16 = tflops_bf16 / reference.peak_tflops_bf16
    knee_fp8 = (tflops_fp8 / reference.peak_tflops_fp8 if tflops_fp8 and reference.peak_tflops_fp8 else knee_bf16)

    def moved(c: ComponentFit | None, nvlink: bool = False, knee: float | None = None) -> ComponentFit | None:
        if c is None:
            return None
        params = dict(c.params)
        note = ""
        if nvlink:
            params["beta_gbps"] = float(f"{params['beta_gbps'] * scale:.6g}")
            note = f", NVLink bandwidth × {scale:.3g}" if scale != 1.0 else ""
        if knee is not None:
            params = gemm_on_datasheet(params, knee)
            note = f", knee m_half × {knee:.3g} (the peaks' ratio)" if knee < 1.0 else ""
        return c.model_copy(update={"params": params, "derived": how + note})

    return reference.model_copy(update={
        "gpu": gpu_name, "peak_tflops_bf16": tflops_bf16, "hbm_tbps": hbm_tbps,
        "peak_tflops_fp8": tflops_fp8, "transferred_from": reference.gpu,
        "gemm": moved(reference.gemm, knee=knee_bf16), "gemm_fp8": moved(reference.gemm_fp8, knee=knee_fp8),
        "gemm_grouped_fp8": moved(reference.gemm_grouped_fp8, knee=knee_fp8),
        "attn_prefill": moved(reference.attn_prefill),
        "attn_decode": moved(reference.attn_decode), "attn_decode_fp8_kv": moved(reference.attn_decode_fp8_kv),
        "stream": moved(reference.stream), "allreduce": moved(reference.allreduce, nvlink=True),
        "allreduce_custom": moved(reference.allreduce_custom, nvlink=True),
        "assumptions": [f"no {gpu_name} kernel timings: {reference.gpu}'s measured kernel efficiencies on {gpu_name}'s "
                        "datasheet (a GPU of another architecture may reach other fractions of its peak; measure it "
                        "with `rollart calibrate profile` + `fit`)"]
        + ([] if tflops_fp8 else [f"{gpu_name} has no FP8 tensor cores: FP8 weights compute in BF16"])
        + list(reference.assumptions),
        "source": f"transferred from {reference.gpu}: " + reference.source})


def shipped_profile_path(gpu: str) -> Path | None:
    path = PROFILE_DIR / f"{gpu.lower()}.yaml"
    return path if path.is_file() else None


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_differences(shipped: object, rebuilt: object, where: str = "") -> list[str]:
    """Fields where two profile dumps (``model_dump()``) differ. Floats agree to 1e-4 relative (the
    YAML keeps six significant digits) or within 1e-12 absolute: a least-squares fit's last digits,
    and a parameter driven to its bound at 0 (a t_seq of 1e-19 or 1e-30 s), depend on the CPU's
    SIMD path in numpy's reductions; a difference that changes a predicted time does not."""
    if isinstance(shipped, dict) and isinstance(rebuilt, dict):
        if shipped.keys() != rebuilt.keys():
            return [f"{where}: keys {sorted(shipped)} vs {sorted(rebuilt)}"]
        return [d for k in shipped for d in profile_differences(shipped[k], rebuilt[k], f"{where}.{k}")]
    if isinstance(shipped, (list, tuple)) and isinstance(rebuilt, (list, tuple)):
        if len(shipped) != len(rebuilt):
            return [f"{where}: {len(shipped)} vs {len(rebuilt)} items"]
        return [d for i, (a, b) in enumerate(zip(shipped, rebuilt))
                for d in profile_differences(a, b, f"{where}[{i}]")]
    if isinstance(shipped, float) and isinstance(rebuilt, float):
        ok = math.isclose(shipped, rebuilt, rel_tol=1e-4, abs_tol=1e-12)
        return [] if ok else [f"{where}: {shipped!r} shipped, {rebuilt!r} from the data"]
    return [] if shipped == rebuilt else [f"{where}: {shipped!r} shipped, {rebuilt!r} from the data"]
