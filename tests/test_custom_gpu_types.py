"""A custom GPU type (a ``cluster.custom_gpus`` sheet that is no shipped preset) is priced by
``calibration.custom_generation_cost``: the measured reference most like it, each step floored by the
measured presets it matches or beats. Two rules, stated over random sheets that dominate a preset:

* a sheet at least as good as a measured preset in every timing figure is never priced slower than that
  preset on any step (prefill, decode, mixed; dense and MoE; BF16 and FP8);
* a BF16 model's step times do not depend on ``tflops_fp8``, and adding FP8 tensor cores never makes an
  FP8 model slower.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rollart.calibration import TIMING_FIELDS, generation_cost, transfer_reference
from rollart.calibration.profiles import shipped_profile_path
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec

MEASURED = [p for p in GPU_PRESETS if shipped_profile_path(p) is not None]  # H800 H20 H100 H200 A100 (+ any new)
GAINS = st.sampled_from([1.0, 1.01, 1.3, 2.0, 4.0])
# (model, tp): dense and MoE, one GPU to a whole 8-GPU board
MODELS = st.sampled_from([("Qwen3-8B", 1), ("Qwen3-8B", 2), ("Qwen3-30B-A3B", 1), ("Qwen3-30B-A3B", 2),
                          ("Qwen3-235B-A22B", 8)])
CTX = 2048
TOL = 1 + 1e-9


def _spec(model: str, dtype: str) -> ModelSpec:
    return ModelSpec.model_validate({"preset": model, "weight_dtype": dtype})


def _better(preset: str, gains: tuple[float, ...], fp8_gain: float | None) -> GpuType:
    """``preset``'s sheet with each timing figure times its gain (never lower); ``fp8_gain`` gives a sheet
    without an FP8 peak (A100) one of that many times its BF16 peak (None: left as it is)."""
    base = dict(GPU_PRESETS[preset])
    sheet = {f: base[f] * g for f, g in zip(("tflops_bf16", "hbm_tbps", "nvlink_gbps"), gains[:3])}
    if base.get("tflops_fp8") is not None:
        sheet["tflops_fp8"] = base["tflops_fp8"] * gains[3]
    elif fp8_gain is not None:
        sheet["tflops_fp8"] = sheet["tflops_bf16"] * fp8_gain
    return GpuType(**{**base, **sheet, "memory_gb": base["memory_gb"] * gains[4], "memory_visible_gib": None})


def _custom(*sheets: GpuType) -> bool:
    """Whether no sheet has a shipped preset's exact timing figures (such a sheet is that preset, priced by
    its own profile, and the rules are about custom types)."""
    return not any(all(s.get(f) == getattr(g, f) for f in TIMING_FIELDS) for g in sheets
               for s in GPU_PRESETS.values())


def _steps(cost) -> list[float]:  # noqa: ANN001
    """Decode iterations (batch 1-256), prefills (128-8k tokens) and mixed steps of one cost model."""
    out = [cost.decode_line(b).total(b * CTX, b, 1) for b in (1, 4, 16, 64, 256)]
    out += [cost.prefill_time(n, n * n / 2, 1) for n in (128, 1024, 8192)]
    out += [cost.mixed_step_time(n, n * n / 2, b, b * CTX, 1) for n, b in ((256, 8), (2048, 64))]
    return out


@settings(max_examples=30, deadline=None)
@given(preset=st.sampled_from(MEASURED), gains=st.tuples(*[GAINS] * 5),
       fp8_gain=st.sampled_from([None, 1.0, 2.0, 4.0]), case=MODELS, dtype=st.sampled_from(["bf16", "fp8"]))
def test_a_sheet_at_least_as_good_as_a_measured_preset_is_never_priced_slower(preset, gains, fp8_gain, case, dtype):
    """Before session 51 the reference alone priced a custom sheet, and a B200-like sheet (2,250 TFLOP/s BF16,
    4,500 FP8, 8 TB/s, NVLink 1,800) decoded Qwen3-235B-A22B FP8 at tp 8, batch 1, in 10.88 ms against the
    H20's 10.43: its reference, the H100, launches an FP8 GEMM in 9.6 µs, the H20 in 4.6 µs. An A100 given
    FP8 tensor cores is also covered (``fp8_gain``): it is no slower than the A100 serving FP8 weight-only."""
    model, tp = case
    sheet = _better(preset, gains, fp8_gain)
    assert all((getattr(sheet, f) or 0) >= (GPU_PRESETS[preset].get(f) or 0) for f in TIMING_FIELDS)
    m = _spec(model, dtype)
    own = generation_cost(m, preset, GpuType(**GPU_PRESETS[preset]), tp)
    custom = generation_cost(m, "GX", sheet, tp)
    for mine, theirs in zip(_steps(custom), _steps(own)):
        assert mine <= theirs * TOL, (preset, sheet, model, dtype, _steps(custom), _steps(own))


LOSSES = st.sampled_from([1.0, 0.99, 0.8, 0.5, 0.25])


@settings(max_examples=30, deadline=None)
@given(preset=st.sampled_from(MEASURED), losses=st.tuples(*[LOSSES] * 5), drop_fp8=st.booleans(), case=MODELS,
       dtype=st.sampled_from(["bf16", "fp8"]))
def test_a_sheet_no_better_than_a_measured_preset_is_never_priced_faster(preset, losses, drop_fp8, case, dtype):
    """The mirror rule: a sheet at most as good as a preset in every timing figure is never priced faster.
    A review found a sheet 1 TFLOP/s short of a B200 priced from the H100's reference (Hopper's share of peak)
    and prefilling Qwen3-32B 6 % faster than the B200 it trails; the reference is now the nearest datasheet
    and each step is raised to its price on every preset that beats the sheet."""
    model, tp = case
    base = dict(GPU_PRESETS[preset])
    sheet = {f: base[f] * g for f, g in zip(("tflops_bf16", "hbm_tbps", "nvlink_gbps"), losses[:3])}
    sheet["tflops_fp8"] = None if drop_fp8 or base.get("tflops_fp8") is None else base["tflops_fp8"] * losses[3]
    worse = GpuType(**{**base, **sheet, "memory_gb": base["memory_gb"], "memory_visible_gib": None})
    assume(_custom(worse))
    m = _spec(model, dtype)
    own = _steps(generation_cost(m, preset, GpuType(**GPU_PRESETS[preset]), tp))
    custom = _steps(generation_cost(m, "GY", worse, tp))
    # where the presets themselves disagree (one the sheet beats is priced below one that beats it: a B200 on
    # the H800's borrowed launch costs against the H20 at batch 1), the floor rule wins; those steps are left out
    fields = ("tflops_bf16", "hbm_tbps", "nvlink_gbps") + (("tflops_fp8",) if dtype == "fp8" else ())
    beaten = [q for q in MEASURED if all((getattr(worse, f) or 0) >= (GPU_PRESETS[q].get(f) or 0) for f in fields)]
    floors = [_steps(generation_cost(m, q, GpuType(**GPU_PRESETS[q]), tp)) for q in beaten]
    for i, (mine, theirs) in enumerate(zip(custom, own)):
        if all(f[i] >= theirs for f in floors):
            assert mine * TOL >= theirs, (preset, worse, model, dtype, custom, own)


def test_a_sheet_just_short_of_a_b200_is_priced_no_faster_than_the_b200() -> None:
    """The review's case: B200's sheet with 2,249 TFLOP/s BF16 (and 4,498 FP8) was priced from the H100's
    efficiencies and prefilled Qwen3-32B at tp 2 in 210 ms against the B200's 224."""
    m = _spec("Qwen3-32B", "bf16")
    b200 = generation_cost(m, "B200", GpuType(**GPU_PRESETS["B200"]), 2)
    short = GpuType(**{**GPU_PRESETS["B200"], "tflops_bf16": 2249.0, "tflops_fp8": 4498.0})
    assert transfer_reference("X", short) == "B200"
    custom = generation_cost(m, "X", short, 2)
    assert custom.prefill_time(8192, 8192 ** 2 / 2, 1) >= b200.prefill_time(8192, 8192 ** 2 / 2, 1)


@settings(max_examples=25, deadline=None)
@given(preset=st.sampled_from(MEASURED), gains=st.tuples(*[GAINS] * 5), fp8=st.sampled_from([1.0, 2.0, 4.0]),
       case=MODELS)
def test_a_bf16_model_never_reads_the_fp8_figure(preset, gains, fp8, case):
    """Whether ``tflops_fp8`` is set, and to what, moves no step of a BF16 model: its reference is chosen on
    the BF16 figures (``transfer_reference``), and its floors are the presets it beats in those. Before,
    the field switched the reference between H100 and A100: Qwen3-8B decoded 0.94-0.95x and Qwen3-30B-A3B
    prefilled 4k tokens 1.10x the time with the field as without."""
    model, tp = case
    m = _spec(model, "bf16")
    sheet = _better(preset, gains, None)
    without = sheet.model_copy(update={"tflops_fp8": None})
    other = sheet.model_copy(update={"tflops_fp8": sheet.tflops_bf16 * fp8})
    assume(_custom(sheet, without, other))
    times = [_steps(generation_cost(m, "GX", s, tp)) for s in (sheet, without, other)]
    assert times[0] == times[1] == times[2]
    assert transfer_reference("GX", sheet) == transfer_reference("GX", without) == transfer_reference("GX", other)


@settings(max_examples=25, deadline=None)
@given(preset=st.sampled_from(MEASURED), gains=st.tuples(*[GAINS] * 5), fp8=st.sampled_from([1.0, 2.0, 4.0]),
       case=MODELS)
def test_fp8_tensor_cores_never_make_an_fp8_model_slower(preset, gains, fp8, case):
    """The same sheet with FP8 tensor cores (an FP8 peak of 1-4x the BF16 one) prices every step of an FP8
    model at most as without them (FP8 weights served weight-only, BF16 compute). Before, the H100's FP8
    GEMM launch replaced the A100's BF16 one, and Qwen3-30B-A3B decoded at batch 1 in 1.10x the time."""
    model, tp = case
    m = _spec(model, "fp8")
    sheet = _better(preset, gains, None)
    without = sheet.model_copy(update={"tflops_fp8": None})
    with_fp8 = sheet.model_copy(update={"tflops_fp8": sheet.tflops_bf16 * fp8})
    assume(_custom(without, with_fp8))
    for mine, theirs in zip(_steps(generation_cost(m, "GX", with_fp8, tp)), _steps(generation_cost(m, "GX", without, tp))):
        assert mine <= theirs * TOL


@pytest.mark.parametrize(("model", "tp"), [("Qwen3-235B-A22B", 8), ("Qwen3-30B-A3B", 2)])
def test_the_probes_blackwell_like_sheet_decodes_no_slower_than_an_h20(model: str, tp: int) -> None:
    """The review probe's case (gen51/dominance.py), on a custom name: 10.88 ms against the H20's 10.43
    before; now at most the H20's, priced from the B200's profile (the nearest reference it beats: Blackwell's
    sustained share, not Hopper's), and the source says which measured GPUs floor it."""
    m = _spec(model, "fp8")
    sheet = GpuType(tflops_bf16=2250, tflops_fp8=4500, hbm_tbps=8.0, memory_gb=180, nvlink_gbps=1800)
    h20 = generation_cost(m, "H20", GpuType(**GPU_PRESETS["H20"]), tp)
    bx = generation_cost(m, "BX", sheet, tp)
    assert bx.decode_line(1).total(CTX, 1, 1) <= h20.decode_line(1).total(CTX, 1, 1)
    assert bx.source.startswith("B200 kernel profile on the BX datasheet") and "H20" in bx.source


def test_a_sheet_no_preset_bounds_is_its_references_composition() -> None:
    """Nothing to bound (a sheet that beats every preset in one figure and trails each in another): the
    reference's composition as before, a plain ``KernelProfileGeneration``; a sheet below every preset in
    every figure is held at least at their prices."""
    from rollart.calibration.cost import KernelProfileGeneration
    m = _spec("Qwen3-8B", "bf16")
    odd = GpuType(tflops_bf16=3000, hbm_tbps=0.9, memory_gb=48, nvlink_gbps=100)
    cost = generation_cost(m, "Oddity", odd, 1)
    assert type(cost) is KernelProfileGeneration and "at most its price" not in cost.source
    small = GpuType(tflops_bf16=120, tflops_fp8=240, hbm_tbps=0.9, memory_gb=48, nvlink_gbps=100)
    slow = generation_cost(m, "L20ish", small, 1)
    assert "at least on the presets that beat it" in slow.source


def _beaten(preset: str, fp8: bool) -> list[str]:
    """The presets with a shipped profile that ``preset`` matches or beats in every timing figure."""
    from rollart.calibration import beaten_presets
    return beaten_presets(GpuType(**GPU_PRESETS[preset]), fp8)


SHIPPED_PAIRS = [(a, b, dtype) for dtype in ("bf16", "fp8") for a in MEASURED for b in _beaten(a, dtype == "fp8")]


@pytest.mark.parametrize(("preset", "beaten", "dtype"), SHIPPED_PAIRS)
@pytest.mark.parametrize(("model", "tp"), [("Qwen3-8B", 1), ("Qwen3-8B", 8), ("Qwen3-30B-A3B", 8),
                                           ("Qwen3-32B", 4)])
def test_a_shipped_preset_is_never_priced_slower_than_one_it_beats(preset, beaten, dtype, model, tp) -> None:
    """A shipped preset at least as good as another in every timing figure (H200 and the H20, B200 and the
    H100, ...) prices no step slower than it. Before, the derived H100/H200/B200/GB200 profiles kept the
    H800's measured FP8 GEMM launch cost (9.6 µs against the H20's 4.6 µs) with no floor: Qwen3-30B-A3B in
    FP8 at tp 8 decoded a batch of 1 in 6.92 ms on an H200 against 6.24 ms on the H20, and 202 such pairs
    of steps were priced the wrong way round."""
    m = _spec(model, dtype)
    mine = generation_cost(m, preset, GpuType(**GPU_PRESETS[preset]), tp)
    theirs = generation_cost(m, beaten, GpuType(**GPU_PRESETS[beaten]), tp)
    for a, b in zip(_steps(mine), _steps(theirs)):
        assert a <= b * TOL


@pytest.mark.parametrize("preset", [p for p in MEASURED if GPU_PRESETS[p].get("tflops_fp8")])
@pytest.mark.parametrize(("model", "tp"), [("Qwen3-8B", 1), ("Qwen3-8B", 8), ("Qwen3-30B-A3B", 8)])
def test_a_shipped_presets_fp8_weights_are_never_slower_than_its_bf16_weights(preset, model, tp) -> None:
    """FP8 weights halve the bytes a weight-bound step reads; an engine that finds the FP8 GEMM's launch
    slower than the weight read it saves serves them weight-only (BF16 compute, 1-byte reads), so no step
    of an FP8 model is slower than the same BF16 model's. Before, Qwen3-30B-A3B on a B200 at tp 8 decoded a
    batch of 1 in 6.88 ms in FP8 against 6.35 ms in BF16; the source names the weight-only floor."""
    gpu = GpuType(**GPU_PRESETS[preset])
    fp8 = generation_cost(_spec(model, "fp8"), preset, gpu, tp)
    bf16 = generation_cost(_spec(model, "bf16"), preset, gpu, tp)
    for a, b in zip(_steps(fp8), _steps(bf16)):
        assert a <= b * TOL
    assert f"{preset} served weight-only" in fp8.source


def test_a_profile_the_user_gives_is_priced_as_measured() -> None:
    """The floors hold the shipped profiles to their datasheets; a kernel profile named in the plan is the
    user's own measurement and is priced as it is, unbounded."""
    from rollart.calibration.cost import KernelProfileGeneration
    m = _spec("Qwen3-30B-A3B", "fp8")
    path = str(shipped_profile_path("H200"))
    cost = generation_cost(m, "H200", GpuType(**GPU_PRESETS["H200"]), 8, path)
    assert type(cost) is KernelProfileGeneration and "at most its price" not in cost.source


def test_calibrate_show_names_the_floors_a_shipped_profile_is_held_under() -> None:
    """`rollart calibrate show b200` says which presets hold its steps down and that FP8 weights may be
    served weight-only; a preset that beats none (H800) names the weight-only floor alone."""
    from rollart.cli_calibrate import _floors_line
    b200 = _floors_line("B200")
    assert "at most its price on H800, H20, H100, H200, A100" in b200 and "served weight-only" in b200
    assert _floors_line("H800") == ("FP8 weights: at most their price served weight-only (BF16 compute, 1-byte "
                                    "weight reads)")
    assert _floors_line("A100") == ""  # no FP8 tensor cores, beats no preset


def test_calibrate_show_prints_floors_only_for_the_shipped_profile(tmp_path) -> None:
    """A copy of a shipped profile given as a YAML is the user's own, priced as measured: no floors line."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    rollart = str(Path(sys.executable).parent / "rollart")
    mine = tmp_path / "mine.yaml"
    shutil.copy(shipped_profile_path("B200"), mine)
    shipped = subprocess.run([rollart, "calibrate", "show", "b200"], capture_output=True, text=True)
    own = subprocess.run([rollart, "calibrate", "show", str(mine)], capture_output=True, text=True)
    assert shipped.returncode == own.returncode == 0
    assert "floors:" in shipped.stdout and "floors:" not in own.stdout
