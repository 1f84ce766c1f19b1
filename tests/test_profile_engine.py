"""Whole-model engine profiles: the tiny Qwen3 model, the torch profiler on a small grid, the
CSV, the ``calibrate profile`` command, and vLLM (which needs a GPU)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from rollart.calibration import profile_engine as pe  # noqa: E402
from rollart.cli_profile import calibrate_profile, resolve_model  # noqa: E402
from rollart.plan.schema import ModelSpec  # noqa: E402

TINY = ModelSpec.model_validate("Qwen3-tiny")
PEAK_TFLOPS = 0.1  # given, so MFU does not depend on a matmul measured under load

# Extremes far apart so a ratio test survives a noisy shared machine: batch 32 vs 1 at a
# 1024-token cache, 256 vs 16 new tokens.
SMALL_GRID = pe.Grid(batch_sizes=(1, 32), kv_lens=(0, 1024), prefill_lens=(16, 256))

HAS_GPU_VLLM = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


# ---------------------------------------------------------------- the model


def test_tiny_model_parameter_count_matches_the_spec():
    model = pe.build_model(TINY, "fp32", "cpu", seed=0)
    assert not model.training
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (2, 64, 4, 2, 16, 128, 1024)
    # Tied: the LM head is the embedding table, counted once as in ModelSpec.params.
    assert TINY.tied_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert pe.matmul_params(model) == TINY.params
    # Everything else is RMSNorm scales: input/post-attention norms, q/k norms, the final norm.
    norms = TINY.layers * (2 * TINY.hidden + 2 * TINY.head_dim) + TINY.hidden
    assert sum(p.numel() for p in model.parameters()) == TINY.params + norms


def test_untied_model_counts_both_embedding_tables():
    spec = ModelSpec.model_validate({"preset": "Qwen3-tiny", "tied_embeddings": False})
    model = pe.build_model(spec, "fp32", "cpu")
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert pe.matmul_params(model) == spec.params == TINY.params + TINY.vocab * TINY.hidden


def test_build_model_is_seeded_and_runs():
    a, b, c = (pe.build_model(TINY, "fp32", "cpu", seed=s) for s in (1, 1, 2))
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    with torch.inference_mode():
        logits = a(input_ids=torch.randint(0, TINY.vocab, (2, 8))).logits
    assert logits.shape == (2, 8, TINY.vocab) and torch.isfinite(logits).all()


def test_moe_specs_are_refused_by_the_torch_engine():
    spec = ModelSpec.model_validate({"preset": "Qwen3-tiny", "moe_experts": 4, "moe_active_experts": 2})
    with pytest.raises(ValueError, match="mixture of experts"):
        pe.model_config(spec)
    ok, why = pe.TorchProfiler(spec).available()
    assert not ok and "mixture of experts" in why


# ---------------------------------------------------------------- FLOPs and the grid


def test_step_flops_follow_the_roofline_convention():
    # the layers' matmuls per token (embeddings out: the input one is a lookup), the LM head once
    # per sequence (its last position), 4·L·H·d per attention pair
    L, H, d = TINY.layers, TINY.heads, TINY.head_dim
    P = TINY.active_params - TINY.vocab * TINY.hidden * (1 if TINY.tied_embeddings else 2)
    head = 2 * TINY.vocab * TINY.hidden
    # decode: 8 sequences, 100 cached tokens each: each new token sees 101 keys.
    assert pe.step_flops(TINY, 8, 100, 1) == 2 * P * 8 + head * 8 + 4 * L * H * d * 8 * 101
    # prefill of 4 tokens after 10 cached: 11 + 12 + 13 + 14 pairs per sequence.
    assert pe.attention_pairs(3, 10, 4) == 3 * (11 + 12 + 13 + 14)
    assert pe.step_flops(TINY, 3, 10, 4) == 2 * P * 12 + head * 3 + 4 * L * H * d * 3 * 50


def test_default_cpu_grid_and_limits():
    g = pe.default_grid(TINY, "cpu")
    assert g.batch_sizes == (1, 2, 4, 8) and g.kv_lens == (0, 64, 128, 256, 512)
    assert g.prefill_lens == (16, 64, 128, 256)
    assert len(g) == 4 * 5 * 4 + 4 * 5
    assert g.max_context == 512 + 256
    capped = pe.Grid(batch_sizes=[8, 1], kv_lens=[512, 0], prefill_lens=[256, 16],
                     max_batch_tokens=256, max_kv_tokens=1024)
    assert capped.batch_sizes == (1, 8)
    pts = set(capped.points())
    assert ("prefill", 8, 0, 256) not in pts          # 2048 new tokens > 256
    assert ("prefill", 8, 0, 16) in pts
    assert ("decode", 8, 512, 1) not in pts           # 8 · 513 KV tokens > 1024
    assert ("decode", 1, 512, 1) in pts
    with pytest.raises(ValueError, match="prefill_lens"):
        pe.Grid(batch_sizes=(1,), kv_lens=(0,), prefill_lens=(0,))


def test_gpu_grid_caps_kv_by_memory():
    g = pe.default_grid(ModelSpec.model_validate("Qwen3-32B"), "cuda", memory_bytes=80 * 10**9)
    assert g.max_batch_tokens == 16384
    assert g.peak_kv_tokens * ModelSpec.model_validate("Qwen3-32B").kv_bytes_per_token < 80 * 10**9 / 3
    assert all(b * n <= 16384 for ph, b, _, n in g.points() if ph == "prefill")


# ---------------------------------------------------------------- the torch profiler


@pytest.fixture(scope="module")
def small_profile():
    """One profile of SMALL_GRID. One intra-op thread: on a 2-vCPU VM two OpenMP threads
    occasionally stall for tens of ms, which would drown the effects under test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    calls = []
    try:
        prof = pe.TorchProfiler(TINY, warmup=1, repeats=2, peak_tflops=PEAK_TFLOPS)
        rows = prof.profile(SMALL_GRID, progress=lambda done, total: calls.append((done, total)))
    finally:
        torch.set_num_threads(threads)
    return rows, calls


def _lat(rows, phase, b, kv, n):
    (row,) = [r for r in rows if (r.phase, r.batch_size, r.kv_len, r.new_tokens) == (phase, b, kv, n)]
    return row.latency_us


def test_torch_profiler_measures_every_grid_point(small_profile):
    rows, calls = small_profile
    assert sorted((r.phase, r.batch_size, r.kv_len, r.new_tokens) for r in rows) == sorted(SMALL_GRID.points())
    assert len(rows) == 2 * 2 * 2 + 2 * 2
    assert all(r.latency_us > 0 and r.mfu > 0 for r in rows)
    assert {(r.dtype, r.kv_dtype) for r in rows} == {("fp32", "fp32")}
    assert all(r.new_tokens == 1 for r in rows if r.phase == "decode")
    assert calls[0] == (0, 12) and calls[-1] == (12, 12) and [d for d, _ in calls] == list(range(13))
    r = rows[0]
    flops = pe.step_flops(TINY, r.batch_size, r.kv_len, r.new_tokens)
    assert r.mfu == pytest.approx(flops / (r.latency_us * 1e-6 * PEAK_TFLOPS * 1e12), rel=1e-3)


def test_decode_latency_grows_with_batch_at_the_longest_context(small_profile):
    rows, _ = small_profile
    kv = max(SMALL_GRID.kv_lens)
    # 32 sequences of 1024 cached tokens read 32× the KV of one: measured ~4–4.5× slower here (one thread).
    assert _lat(rows, "decode", 32, kv, 1) > 1.5 * _lat(rows, "decode", 1, kv, 1)


def test_prefill_latency_grows_with_new_tokens(small_profile):
    rows, _ = small_profile
    for kv in SMALL_GRID.kv_lens:
        # 32 × 256 vs 32 × 16 new tokens: measured ~11–19× here (one thread).
        assert _lat(rows, "prefill", 32, kv, 256) > 2.0 * _lat(rows, "prefill", 32, kv, 16)


def test_profiler_leaves_the_thread_count_alone():
    before = torch.get_num_threads()
    pe.TorchProfiler(TINY, warmup=0, repeats=1, peak_tflops=PEAK_TFLOPS).profile(
        pe.Grid(batch_sizes=(1,), kv_lens=(0,), prefill_lens=(4,)))
    assert torch.get_num_threads() == before


def test_measured_peak_is_plausible():
    peak = pe.measure_peak_tflops("cpu", "fp32")
    assert 1e-4 < peak < 100  # TFLOP/s: anything from a slow core to a big socket
    assert pe.measure_peak_tflops("cpu", torch.float32) == peak  # cached per device and dtype


def test_engines_satisfy_the_protocol():
    assert isinstance(pe.TorchProfiler(TINY), pe.EngineProfiler)
    assert isinstance(pe.VllmProfiler("Qwen3-tiny"), pe.EngineProfiler)
    assert pe.TorchProfiler(TINY).available() == (True, "")


# ---------------------------------------------------------------- CSV


def test_csv_round_trip(small_profile, tmp_path):
    rows, _ = small_profile
    path = tmp_path / "sub" / "profile.csv"
    pe.write_rows(rows, path)
    lines = path.read_text().splitlines()
    assert lines[0] == "phase,dtype,kv_dtype,batch_size,kv_len,new_tokens,latency_us,mfu"
    assert len(lines) == 1 + len(rows)
    assert pe.read_rows(path) == rows
    made = [pe.make_row(TINY, "decode", "bf16", "fp8", 4, 100, 1, 1.23456789e-3, 1e12)]
    pe.write_rows(made, path)
    assert pe.read_rows(path) == made and made[0].latency_us == 1234.568


def test_read_rows_rejects_other_formats(tmp_path):
    infersim = tmp_path / "decode.csv"
    infersim.write_text("dtype,kv_dtype,batch_size,kv_len,latency_us,mfu\nbf16,bf16,1,1024,29.16,0.016\n")
    with pytest.raises(ValueError, match="expected columns"):
        pe.read_rows(infersim)
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(pe.COLUMNS) + "\ntrain,fp32,fp32,1,0,1,1.0,0.1\n")
    with pytest.raises(ValueError, match="phase"):
        pe.read_rows(bad)


# ---------------------------------------------------------------- model resolution


def test_resolve_model_from_preset_hf_config_and_yaml(tmp_path):
    assert resolve_model("qwen3-tiny") == (TINY, None)
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(pe.hf_config_dict(TINY, 4096)))
    spec, path = resolve_model(str(cfg))
    assert path == cfg and spec.name == "tiny"
    assert spec.model_dump(exclude={"name"}) == TINY.model_dump(exclude={"name"})
    assert resolve_model(str(cfg.parent))[0] == spec  # the folder works too
    y = tmp_path / "half.yaml"
    y.write_text("preset: Qwen3-tiny\nlayers: 1\n")
    spec, path = resolve_model(str(y))
    assert path is None and spec.layers == 1 and spec.hidden == 64
    with pytest.raises(ValueError, match="unknown model preset 'nope'"):
        resolve_model("nope")
    with pytest.raises(ValueError, match="no such file"):
        resolve_model(str(tmp_path / "missing.yaml"))
    y.write_text("layers: 2\nhidden: 64\n")
    with pytest.raises(ValueError, match="heads"):
        resolve_model(str(y))


# ---------------------------------------------------------------- the command


def _app() -> typer.Typer:
    app = typer.Typer()
    calibrate = typer.Typer()
    calibrate.command("profile")(calibrate_profile)
    app.add_typer(calibrate, name="calibrate")
    return app


def _invoke(*args: str):
    return CliRunner().invoke(_app(), ["calibrate", "profile", *args], env={"COLUMNS": "160", "NO_COLOR": "1"})


def test_cli_writes_the_profile(tmp_path, monkeypatch):
    grid = pe.Grid(batch_sizes=(1, 2), kv_lens=(0, 32), prefill_lens=(8, 16))
    monkeypatch.setattr(pe, "default_grid", lambda spec, device, memory_bytes=None: grid)
    out = tmp_path / "tiny.csv"
    result = _invoke("--model", "Qwen3-tiny", "--out", str(out), "--repeats", "1", "--peak-tflops", "0.1")
    assert result.exit_code == 0, result.output
    rows = pe.read_rows(out)
    assert sorted((r.phase, r.batch_size, r.kv_len, r.new_tokens) for r in rows) == sorted(grid.points())
    assert "prefill ms" in result.output and "decode step ms" in result.output
    assert f"{len(grid)} points" in result.output and "peak 0.1 TFLOP/s (given)" in result.output


def test_cli_vllm_without_a_gpu_exits_2(tmp_path):
    if HAS_GPU_VLLM:
        pytest.skip("vLLM and a CUDA device are present: the refusal does not apply")
    out = tmp_path / "v.csv"
    result = _invoke("--engine", "vllm", "--out", str(out))
    assert result.exit_code == 2
    assert "vllm" in result.output or "CUDA" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_cli_refuses_a_model_too_large_for_the_device(tmp_path):
    result = _invoke("--model", "Qwen3-32B", "--out", str(tmp_path / "big.csv"))
    assert result.exit_code == 2
    assert "Qwen3-32B needs about" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (("--model", "nope"), "unknown model preset"),
    (("--engine", "tensorrt"), "unknown engine"),
    (("--device", "tpu"), "not a device"),
])
def test_cli_input_errors_exit_2(tmp_path, args, message):
    result = _invoke(*args, "--out", str(tmp_path / "x.csv"))
    assert result.exit_code == 2 and message in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cli_torch_on_cuda_without_a_gpu_exits_2(tmp_path):
    result = _invoke("--device", "cuda", "--out", str(tmp_path / "x.csv"))
    assert result.exit_code == 2 and "CUDA" in result.output


# ---------------------------------------------------------------- vLLM


def test_module_imports_without_torch_or_vllm():
    code = ("import sys, rollart.calibration.profile_engine as pe, rollart.cli_profile; "
            "assert pe.Grid((1,), (0,), (1,)); "
            "bad = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_vllm_unavailable_here_says_why():
    if HAS_GPU_VLLM:
        pytest.skip("vLLM and a CUDA device are present")
    ok, why = pe.VllmProfiler("Qwen3-tiny").available()
    assert not ok and ("vllm" in why or "CUDA" in why)
    with pytest.raises(RuntimeError):
        pe.VllmProfiler("Qwen3-tiny").profile(SMALL_GRID)


class _FakeLLM:
    """Stands in for ``vllm.LLM``: records the engine arguments and every generate call."""

    last: "_FakeLLM | None" = None

    def __init__(self, model: str, **kwargs):
        self.kwargs = kwargs
        self.model_dir = Path(model)
        self.config = json.loads((self.model_dir / "config.json").read_text())
        self.calls: list = []
        _FakeLLM.last = self

    def generate(self, prompts, params, use_tqdm=True):
        ids = [p["prompt_token_ids"] for p in prompts]
        self.calls.append((ids, params))
        time.sleep(2e-4 * params.max_tokens)  # decode steps cost time
        return []

    def reset_prefix_cache(self):
        self.calls.append("reset")


def test_vllm_profiler_drives_the_offline_api(monkeypatch):
    """The vLLM code path without vLLM: the engine arguments, the prompts of each point and the
    config.json written for a preset (the real engine runs in the GPU test below)."""
    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    fake.LLM = _FakeLLM
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    grid = pe.Grid(batch_sizes=(2,), kv_lens=(0, 64), prefill_lens=(16,))
    prof = pe.VllmProfiler("Qwen3-tiny", tp=2, warmup=1, repeats=2, decode_steps=8, peak_tflops=1.0)
    assert prof.available() == (True, "")
    rows = prof.profile(grid)
    llm = _FakeLLM.last
    assert llm is not None and not llm.model_dir.exists()  # the temporary config folder is removed
    kw = llm.kwargs
    assert kw["load_format"] == "dummy" and kw["tensor_parallel_size"] == 2 and kw["skip_tokenizer_init"]
    assert kw["enable_prefix_caching"] and kw["max_model_len"] >= grid.max_context
    assert kw["max_num_seqs"] >= 2 and kw["dtype"] == "bfloat16"
    cfg = llm.config
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"], cfg["num_key_value_heads"],
            cfg["tie_word_embeddings"], cfg["model_type"]) == (2, 64, 16, 2, True, "qwen3")
    calls = [c for c in llm.calls if c != "reset"]
    assert all(p.ignore_eos and p.temperature == 0.0 for _, p in calls)
    # Prefill with 64 cached tokens: an untimed max_tokens=1 call over the prefixes, then each
    # timed prompt is that prefix plus 16 fresh tokens.
    i = next(k for k, (ids, _) in enumerate(calls) if [len(x) for x in ids] == [64, 64])
    prefixes = calls[i][0]
    timed = calls[i + 1: i + 1 + 3]
    for ids, params in timed:
        assert params.max_tokens == 1 and [len(x) for x in ids] == [80, 80]
        assert [x[:64] for x in ids] == prefixes
    # Decode at kv_len 64 with 8 steps: prompts of 64 − 4 tokens, 1 and 1 + 8 tokens generated.
    dec = [(len(ids[0]), p.max_tokens) for ids, p in calls if len(ids[0]) == 60]
    assert dec and set(dec) == {(60, 1), (60, 9)}
    assert sorted((r.phase, r.batch_size, r.kv_len, r.new_tokens) for r in rows) == sorted(grid.points())
    decode = [r for r in rows if r.phase == "decode"]
    assert all(r.latency_us > 0 for r in rows) and all(r.latency_us < 20e3 for r in decode)


@pytest.mark.skipif(not HAS_GPU_VLLM, reason="needs vLLM and a CUDA device (pip install 'rollart[gpu]' on a GPU machine)")
def test_vllm_profiles_a_small_model_on_the_gpu():
    # head_dim 64: every vLLM attention backend supports it (16, the tiny preset's, is not certain).
    spec = ModelSpec(name="vllm-small", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                     intermediate=512, vocab=1024, tied_embeddings=True)
    grid = pe.Grid(batch_sizes=(1, 16), kv_lens=(0, 512), prefill_lens=(32, 256))
    rows = pe.VllmProfiler(spec, tp=1, repeats=2, decode_steps=16).profile(grid)
    assert sorted((r.phase, r.batch_size, r.kv_len, r.new_tokens) for r in rows) == sorted(grid.points())
    assert all(r.latency_us > 0 and math.isfinite(r.mfu) for r in rows)
    assert {r.dtype for r in rows} == {"bf16"}
