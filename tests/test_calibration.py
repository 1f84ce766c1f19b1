"""Calibrated GPU profiles: fit errors, determinism, YAML round trip, composition, CLI."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rollart.calibration import generation_cost
from rollart.calibration import kernels as K
from rollart.calibration.build import build
from rollart.calibration.engine_fit import EngineFitError, fit_engine_csv
from rollart.calibration.links import calibrated_links
from rollart.calibration.profiles import load_profile, profile_differences, save_profile, shipped_profile_path
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, Link, ModelSpec
from tests.conftest import run_sim, small_plan

ROLLART = str(Path(sys.executable).parent / "rollart")

# The held-out MAPE each shipped profile reaches (reported in calibration/profiles/*.yaml); a
# change to data, models or fitting that makes them worse fails here.
LIMITS = {"h800": (0.08, 0.09), "h100": (0.08, 0.09), "h20": (0.045, 0.09), "h200": (0.08, 0.09),
          "a100": (0.06, 0.10)}


@pytest.fixture(scope="module", params=sorted(LIMITS))
def built(request):
    return request.param, build(request.param)


def test_heldout_error_stays_under_the_reported_limit(built) -> None:
    gpu, profile = built
    prefill_limit, decode_limit = LIMITS[gpu]
    assert profile.fit_error.prefill_mape_heldout <= prefill_limit
    assert profile.fit_error.decode_mape_heldout <= decode_limit
    measured = profile.gemm if profile.gemm.mape_heldout is not None else profile.gemm_fp8  # H20: FP8 timings only
    assert measured.mape_heldout < 0.10 and profile.attn_decode.mape_heldout < 0.15


def test_shipped_profile_is_what_the_data_gives(built) -> None:
    gpu, profile = built
    assert profile_differences(load_profile(shipped_profile_path(gpu)).model_dump(), profile.model_dump()) == []


def test_profile_comparison_catches_a_moved_constant(built) -> None:
    gpu, profile = built
    dump = profile.model_dump()
    moved = load_profile(shipped_profile_path(gpu)).model_dump()
    moved["attn_decode"]["params"]["e_bw"] *= 1.001  # a 0.1 % change in the streaming rate is a real change
    assert profile_differences(moved, dump) == [f".attn_decode.params.e_bw: {moved['attn_decode']['params']['e_bw']!r} "
                                                f"shipped, {dump['attn_decode']['params']['e_bw']!r} from the data"]


def test_build_check_compares_without_writing_and_help_writes_nothing(capsys, monkeypatch) -> None:
    from rollart.calibration import build as B

    shipped = {p: p.read_bytes() for p in B.PROFILE_DIR.glob("*.yaml")}
    with pytest.raises(SystemExit) as exc:  # --help used to rebuild and rewrite every shipped profile
        B.main(["--help"])
    assert exc.value.code == 0
    assert B.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert all(f"{gpu}: as shipped" in out for gpu in B.GPUS)
    real = B.build
    monkeypatch.setattr(B, "build", lambda gpu: real(gpu).model_copy(update={"iteration_overhead_s": 0.004}))
    assert B.main(["--check"]) == 1
    assert ".iteration_overhead_s: 0.003 shipped, 0.004 from the data" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in B.PROFILE_DIR.glob("*.yaml")} == shipped


def test_profile_round_trips_through_yaml(built, tmp_path: Path) -> None:
    _, profile = built
    save_profile(profile, tmp_path / "p.yaml", header="test")
    assert load_profile(tmp_path / "p.yaml") == profile


def test_derivations_are_written_into_the_profile() -> None:
    h800, h20 = build("h800"), build("h20")
    assert h800.attn_prefill.derived and h800.attn_prefill.mape_heldout is None  # no H800 prefill data
    assert "FP8" in (h20.gemm.derived or "")
    # H20's weight reads come from its memory system (decode-attention streaming); its DeepGEMM fits read at
    # that same rate (pinned), their small-m time being the 64-row tile's compute, not a slower HBM
    assert "streaming efficiency" in (h20.gemm.derived or "")
    assert h20.gemm.params["e_mem"] == h20.gemm_fp8.params["e_mem"] == h20.gemm_grouped_fp8.params["e_mem"]
    assert "pinned at the memory-system rate" in (h20.gemm_fp8.dtype or "")
    assert h20.gemm.dtype == "bf16" and (h20.gemm_fp8.dtype or "").startswith("fp8")
    # the measured shape of the hardware: H20 reaches ~3/4 of its datasheet KV bandwidth, H800 ~all
    assert 0.65 < h20.attn_decode.params["e_bw"] < 0.85
    assert 0.9 < h800.attn_decode.params["e_bw"] <= 1.05


@pytest.mark.parametrize("gpu", ["H800", "H20"])
def test_decode_fit_does_not_depend_on_the_last_bits_of_the_arithmetic(gpu: str) -> None:
    """Timings moved by 1e-12 (what another CPU's SIMD path does to numpy's sums) give the same
    fit. From one start, H800's landed at e_c 0.33 on one machine and stayed at its start, 0.5, on
    another (soft-L1 cost 126 vs 186), so a fresh clone rebuilt a different profile."""
    from rollart.calibration import datasets as D
    from rollart.calibration.build import SMS

    X, y = D.infersim_decode_attention(gpu.lower())[:2]
    peak, bw = GPU_PRESETS[gpu]["tflops_bf16"] * 1e12, GPU_PRESETS[gpu]["hbm_tbps"] * 1e12
    fits = [K.fit_decode_attention(X, y * (1 + 1e-12 * np.random.default_rng(i).standard_normal(len(y))),
                                   peak, bw, SMS[gpu]).params for i in range(4)]
    for p in fits[1:]:
        assert profile_differences(fits[0], p) == []


@pytest.mark.parametrize("gpu", ["h800", "h20", "h100", "a100"])
def test_shipped_profile_survives_timings_moved_in_their_last_bits(gpu: str, monkeypatch) -> None:
    """Every fit of the build, not only the decode fit: the shipped profile is what any CPU rebuilds."""
    from rollart.calibration import datasets as D

    rows, rng = D._rows, np.random.default_rng(7)

    def perturbed(path: Path, columns: list[str] | None = None) -> list[dict[str, str]]:
        out = rows(path, columns)
        for r in out:
            for k in [k for k in r if "latency" in k or "time" in k or k.endswith("_us")]:
                try:
                    r[k] = repr(float(r[k]) * (1 + 1e-12 * rng.standard_normal()))
                except (TypeError, ValueError):
                    pass
        return out

    monkeypatch.setattr(D, "_rows", perturbed)
    assert profile_differences(load_profile(shipped_profile_path(gpu)).model_dump(), build(gpu).model_dump()) == []


def test_decode_kernels_without_split_kv_are_found_and_composed() -> None:
    h800, h20 = build("h800"), build("h20")
    marked = lambda p: {k for k, v in p.attn_decode.params.items() if k.startswith(K.UNSPLIT) and v}  # noqa: E731
    # only InferSim's H20 64-2-128 timings are flat in the batch (one CTA per sequence × KV head)
    assert marked(h20) == {"unsplit_64_2_128"} and marked(h800) == set()
    gpu = GpuType(**GPU_PRESETS["H20"])
    odd = ModelSpec.model_validate("Qwen3-8B").model_copy(update={"heads": 64, "kv_heads": 2})
    cost = generation_cost(odd, "H20", gpu, 1)
    p, ctx = h20.attn_decode.params, 65536

    def attention(b: int) -> float:  # one layer's decode attention as the engine composes it
        line = cost.decode_line(b)
        return (line.total(b * ctx, b, 1) - line.total(0, b, 1)) / odd.layers + p["t0"] + p["t_seq"] * b

    kernel = K.decode_attention_time(np.array([[b, ctx, 64, 2, 128, 2.0] for b in (1, 32, 64)]), p,
                                     h20.peak_tflops_bf16 * 1e12, h20.hbm_tbps * 1e12)
    assert np.allclose([attention(b) for b in (1, 32, 64)], kernel, rtol=1e-9)
    assert kernel[0] == pytest.approx(kernel[1], rel=1e-3) and kernel[2] > 1.5 * kernel[1]
    # a split-KV geometry (Qwen3-8B's own) keeps the plain linear cost
    plain = generation_cost(ModelSpec.model_validate("Qwen3-8B"), "H20", gpu, 1).decode_line(1)
    assert plain.m1 == pytest.approx(36 * 2 * 8 * 128 * 2 / (4e12 * p["e_bw"]))


def test_composed_costs_show_the_hardware_contrast() -> None:
    model = ModelSpec.model_validate("Qwen3-8B")
    h800 = generation_cost(model, "H800", GpuType(**GPU_PRESETS["H800"]), 1)
    h20 = generation_cost(model, "H20", GpuType(**GPU_PRESETS["H20"]), 1)
    assert "calibrated kernel profile" in h800.source
    # prefill (compute-bound): H800 several times faster per GPU
    assert h20.prefill_time(4096, 4096**2 / 2) > 3 * h800.prefill_time(4096, 4096**2 / 2)
    # decode (bandwidth-bound): within ~40 % per GPU, so H20 wins per dollar at 1 H800 ≈ 3 H20
    d800 = h800.decode_line(64).total(64 * 4000, 64, 1)
    d20 = h20.decode_line(64).total(64 * 4000, 64, 1)
    assert d800 < d20 < 1.4 * d800


def test_links_are_fitted_from_nccl_data() -> None:
    links = calibrated_links()
    assert 2000 < links["nvlink"]["bandwidth_gbps"] < 3500 and links["nvlink"]["mape_heldout"] < 0.05
    assert 200 < links["ib"]["bandwidth_gbps"] < 400
    assert Link(kind="ib").bytes_per_s == pytest.approx(links["ib"]["bandwidth_gbps"] * 1e9 / 8)
    assert Link(kind="tcp", bandwidth_gbps=100).bytes_per_s == 100e9 / 8  # explicit numbers win


def _engine_csv(path: Path, a=2e-3, b=3e-5, c=1e-9, da=4e-3, db=2e-4, dc=5e-8, noise=0.0, seed=0) -> None:
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phase", "dtype", "kv_dtype", "batch_size", "kv_len", "new_tokens", "latency_us", "mfu"])
        for batch in (1, 2, 4, 8):
            for kv in (0, 64, 256, 512):
                for new in (16, 64, 256):
                    n, pairs = batch * new, batch * new * (kv + new / 2)
                    t = (a + b * n + c * pairs) * (1 + noise * rng.standard_normal())
                    w.writerow(["prefill", "float32", "float32", batch, kv, new, t * 1e6, 0.1])
                t = (da + db * batch + dc * batch * kv) * (1 + noise * rng.standard_normal())
                w.writerow(["decode", "float32", "float32", batch, kv, 1, t * 1e6, 0.01])


def test_engine_fit_recovers_known_coefficients(tmp_path: Path) -> None:
    _engine_csv(tmp_path / "p.csv")
    profile = fit_engine_csv(tmp_path / "p.csv", gpu="cpu-local", model="Qwen3-tiny")
    assert profile.prefill.params["b"] == pytest.approx(3e-5, rel=1e-3)
    assert profile.decode.params["c"] == pytest.approx(5e-8, rel=1e-3)
    assert profile.fit_error.decode_mape_heldout < 1e-6


def test_engine_fit_rejects_bad_files(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("phase,latency_us\nprefill,3\n")
    with pytest.raises(EngineFitError, match="missing columns"):
        fit_engine_csv(tmp_path / "bad.csv", gpu="x", model="Qwen3-tiny")


def test_fit_cli_then_simulate_with_the_engine_profile(tmp_path: Path) -> None:
    _engine_csv(tmp_path / "p.csv", noise=0.02)
    env = dict(os.environ, COLUMNS="120")
    out = subprocess.run([ROLLART, "calibrate", "fit", "p.csv", "--gpu", "cpu-local", "--model", "Qwen3-8B",
                          "--out", "cpu.yaml"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "held-out MAPE" in out.stdout and (tmp_path / "cpu.yaml").is_file()
    plan = small_plan([f"cluster.gpu_pools.h20.profile={tmp_path / 'cpu.yaml'}"])
    result = run_sim(plan, "rollart").to_result()
    assert result.calibration["H20"].startswith("calibrated engine profile cpu-local/Qwen3-8B")


def test_engine_profile_for_another_model_is_refused(tmp_path: Path) -> None:
    _engine_csv(tmp_path / "p.csv")
    save_profile(fit_engine_csv(tmp_path / "p.csv", gpu="cpu", model="Qwen3-tiny"), tmp_path / "tiny.yaml")
    from rollart.plan import PlanError

    with pytest.raises(PlanError, match="cluster.gpu_pools.h20.profile: .*measured for Qwen3-tiny, not Qwen3-8B"):
        run_sim(small_plan([f"cluster.gpu_pools.h20.profile={tmp_path / 'tiny.yaml'}"]), "rollart")


def test_missing_profile_file_is_a_plan_error(tmp_path: Path) -> None:
    from rollart.plan import PlanError

    with pytest.raises(PlanError, match="cluster.gpu_pools.h20.profile: no profile file"):
        small_plan(["cluster.gpu_pools.h20.profile=nope.yaml"])


@pytest.mark.parametrize("gpu", ["h20", "h800"])
def test_calibrate_show_prints_fits_and_plots(gpu: str, tmp_path: Path) -> None:
    out = subprocess.run([ROLLART, "calibrate", "show", gpu, "--plot", "fit.png"], cwd=tmp_path,
                         capture_output=True, text=True, env=dict(os.environ, COLUMNS="120"))
    assert out.returncode == 0, out.stderr
    profile = build(gpu)
    assert f"prefill {profile.fit_error.prefill_mape_heldout:.1%}" in out.stdout
    assert f"decode {profile.fit_error.decode_mape_heldout:.1%}" in out.stdout
    assert "assumption" in out.stdout and "source" in out.stdout
    # one line per composed term, naming its dtype and its derivation
    from rollart.calibration.profiles import term_lines

    terms = [ln for ln in out.stdout.splitlines() if ln.startswith("term ")]
    assert len(terms) == len(term_lines(profile)) >= 7 and all(" dtype " in ln for ln in terms)
    bf16 = next(ln for ln in terms if ln.startswith("term linear layers, BF16 weights"))
    # the small-batch ceiling: the tile outlasts H20's weight read, not H800's
    assert "few-row GEMM computes at least" in bf16 and (("binds first" in bf16) == (gpu == "h20"))
    assert any(ln.startswith("term linear layers, FP8 weights: dtype fp8") and "composed as fitted" in ln
               and ("pinned at the memory-system rate" in ln if gpu == "h20" else "the kernel's, measured" in ln)
               for ln in terms)
    assert any(ln.startswith("term decode attention, FP8 KV: dtype fp8") for ln in terms)
    assert (tmp_path / "fit.png").stat().st_size > 10_000


def test_calibrate_show_without_a_name_gives_one_line_per_shipped_profile(tmp_path: Path) -> None:
    """Every shipped profile, with its held-out error and which terms are measured on that GPU or derived;
    every name it lists (links included) can then be shown on its own."""
    from rollart.calibration.profiles import shipped_profiles

    env = dict(os.environ, COLUMNS="400")
    out = subprocess.run([ROLLART, "calibrate", "show"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    rows = {ln.split()[0]: ln for ln in out.stdout.splitlines()[1:] if ln.split() and ln.split()[0] in shipped_profiles()}
    assert set(rows) == set(shipped_profiles()) >= {"h20", "h800", "links"}
    h20 = build("h20")
    assert f"prefill {h20.fit_error.prefill_mape_heldout:.1%}" in rows["h20"]
    assert "measured: GEMM fp8" in rows["h20"] and "derived: GEMM bf16" in rows["h20"]  # H20 has FP8 timings only
    assert "assumed: iteration overhead 3 ms" in rows["h800"] and "nvlink" in rows["links"]
    for name in shipped_profiles():
        one = subprocess.run([ROLLART, "calibrate", "show", name], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert one.returncode == 0 and "Traceback" not in one.stderr, (name, one.stderr)
    links = subprocess.run([ROLLART, "calibrate", "show", "links"], cwd=tmp_path, capture_output=True, text=True,
                           env=env).stdout
    assert "200 Gbps" in links and "publish" in links and "measured through the real Mooncake store" in links
    bad = subprocess.run([ROLLART, "calibrate", "show", "--plot", "x.png"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--plot" in bad.stderr and not (tmp_path / "x.png").exists()


def test_calibrate_show_unknown_profile_exits_2(tmp_path: Path) -> None:
    out = subprocess.run([ROLLART, "calibrate", "show", "h900"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 2 and "no profile 'h900'" in out.stderr and "Traceback" not in out.stderr


def _mixed_step_unmemoised(c, new_tokens: int, pairs: float, batch: int, context: float) -> float:
    """The kernel-profile mixed step as one expression (what the memoised method must equal bit for bit)."""
    from rollart.sim.costs.moe import busiest_rank_sequences

    seqs = busiest_rank_sequences(batch, c.ep)  # the busiest attention rank's whole sequences
    attn = c._prefill_attention(new_tokens / c.ep, pairs)
    if batch:
        d = c._attn_decode
        attn += d["t0"] + d["t_seq"] * seqs + context * max(*c._per_cached_token(batch))
    tokens = new_tokens + batch
    return (c.profile.iteration_overhead_s + c.model.layers * (c._layer_tokens(tokens) + attn)
            + c._gemms(max(1.0, seqs), c._lm_head, c._bf16)
            # the busiest rank's prompts (an even share: no prompt count given) and decoding sequences, on
            # the all-to-all kernels of a step that prefills
            + (c._allreduce(tokens, new_tokens / c.ep + seqs, "normal") if c.ep > 1
               else c._allreduce(tokens, kernel="normal")))


MOE_30B = {"name": "Qwen3-30B-A3B", "layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
           "intermediate": 768, "vocab": 151936, "moe_experts": 128, "moe_active_experts": 8}


@pytest.mark.parametrize("model,gpu,tp,ep", [("Qwen3-8B", "H800", 1, 1), ("Qwen3-32B", "H20", 4, 1),
                                             (MOE_30B, "H800", 2, 2)])
def test_memoised_mixed_step_is_exact(model, gpu, tp, ep):
    """The mixed step memoises its per-decode-batch terms: every value, first call or memo hit,
    equals the unmemoised formula exactly, and the memo holds one entry per batch size."""
    c = generation_cost(ModelSpec.model_validate(model), gpu, GpuType(**GPU_PRESETS[gpu]), tp, ep=ep)
    rng = np.random.default_rng(0)
    cases = [(int(n), float(n) * float(ctx), int(b), float(b) * float(ctx))
             for n, b, ctx in zip(rng.integers(1, 9000, 40), rng.integers(0, 5, 40) ** 3, rng.integers(1, 30000, 40))]
    for n, pairs, b, ctx in cases + cases:  # the second pass hits the memo where it was kept
        assert c.mixed_step_time(n, pairs, b, ctx) == _mixed_step_unmemoised(c, n, pairs, b, ctx)
    assert set(c._mixed_batch) == {b for _, _, b, _ in cases}
    assert set(c._per_tokens) == {n + b for n, _, b, _ in cases}  # one entry per step token count
    # prefill uses the same memo, and gives the unmemoised prefill exactly
    n, pairs = cases[0][0], cases[0][1]
    plain = (c.profile.iteration_overhead_s + c.model.layers * (c._layer_tokens(n) + c._prefill_attention(n / c.ep, pairs))
             + c._gemms(1, c._lm_head, c._bf16) + c._allreduce(n, kernel="normal"))
    assert c.prefill_time(n, pairs) == plain


def test_token_memo_stays_bounded(monkeypatch):
    """The per-token-count memo is emptied when full, so a run of any length holds at most _TOKEN_MEMO
    entries, and values computed after the reset are still exact."""
    import rollart.calibration.cost as cost

    monkeypatch.setattr(cost, "_TOKEN_MEMO", 8)
    c = generation_cost(ModelSpec.model_validate("Qwen3-8B"), "H800", GpuType(**GPU_PRESETS["H800"]), 1)
    for n in range(1, 50):
        assert c.mixed_step_time(n, n * n / 2, 4, 4000.0) == _mixed_step_unmemoised(c, n, n * n / 2, 4, 4000.0)
        assert len(c._per_tokens) <= 8


def test_a_pd_run_reads_the_link_table_once(monkeypatch):
    """Links read their unset figures from links.yaml, and a PD run asks a link's latency for every KV
    transfer: the table must be parsed once per process, not per call (a lost cache once stalled
    `rollart reproduce`'s PD variants at its watchdog)."""
    import yaml

    from rollart.calibration import links
    from tests.conftest import small_plan

    from rollart.core import mode_config
    from rollart.sim import simulate_plan

    plan = small_plan(["placement.pd_disaggregation=true", "algorithm.steps=2",
                       "placement.generation=[{pool: h800, workers: 1, tp: 1, role: prefill}, "
                       "{pool: h20, workers: 2, tp: 1, role: decode}]"])
    links.calibrated_links.cache_clear()
    parsed = []

    class CountingYaml:  # links.py's yaml, counting the parses of the link table
        @staticmethod
        def safe_load(*a, **k):
            parsed.append(1)
            return yaml.safe_load(*a, **k)

    monkeypatch.setattr(links, "yaml", CountingYaml)
    simulate_plan(plan, mode_config(plan, None), 0)
    links.calibrated_links()
    assert len(parsed) == 1
