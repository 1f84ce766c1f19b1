"""The GPU trainers' paths: the Megatron GRPO step and its resume (CUDA + megatron-core only,
skipped here with the reason), its weights-only checkpoint state (CPU), and TorchEngine with
the torch GRPO trainer on the Digits task in one process (CPU here, CUDA on the GPU machine)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rollart.runtime.trainer import megatron as M  # noqa: E402

CHECKS_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "checks.py"
MEGATRON_OK, MEGATRON_WHY = M.available()


def _checks():
    spec = importlib.util.spec_from_file_location("rollart_gpu_checks", CHECKS_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class _Config:  # stands in for megatron's OptimizerConfig in a param group
    lr: float = 1e-3


def _optimizer_state(cfg: _Config) -> dict:
    p = torch.nn.Parameter(torch.randn(3, 2))
    return {"optimizer": {"state": {0: {"step": torch.tensor(2.0), "exp_avg": torch.randn(3, 2)}},
                          "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0], "optimizer": cfg,
                                            "wd_mult": 1.0, "foreach": None}]},
            "fp32_from_fp16_params": [[p]]}


def test_optimizer_state_round_trips_through_a_weights_only_load(tmp_path):
    live_cfg = _Config()
    state = _optimizer_state(_Config())
    saved = M.to_weights_only(state)
    assert saved["optimizer"]["param_groups"][0]["optimizer"] == {M.OPAQUE: f"{__name__}._Config"}
    torch.save(saved, tmp_path / "optim.pt")
    with pytest.raises(Exception):  # the object itself would need full unpickling
        torch.save(state, tmp_path / "raw.pt")
        torch.load(tmp_path / "raw.pt", weights_only=True)
    loaded = torch.load(tmp_path / "optim.pt", weights_only=True)
    back = M.from_weights_only(loaded, _optimizer_state(live_cfg))
    group = back["optimizer"]["param_groups"][0]
    assert group["optimizer"] is live_cfg and group["betas"] == (0.9, 0.999) and group["foreach"] is None
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    p = back["fp32_from_fp16_params"][0][0]
    assert type(p) is torch.Tensor and torch.equal(p, state["fp32_from_fp16_params"][0][0].detach())


def test_an_object_without_a_live_counterpart_is_refused():
    saved = M.to_weights_only({"param_groups": [{"optimizer": _Config()}]})
    with pytest.raises(ValueError, match=r"param_groups'\]\[0\]\['optimizer'\] held a .*_Config"):
        M.from_weights_only(saved, {"param_groups": []}, "optim.pt")


def test_megatron_checkpoints_load_weights_only():
    src = Path(M.__file__).read_text()
    assert "weights_only=False" not in src and src.count("weights_only=True") >= 3


@pytest.mark.skipif(not MEGATRON_OK, reason=f"Megatron GRPO step: {MEGATRON_WHY}")
def test_megatron_grpo_step_and_resume_on_a_gpu():  # pragma: no cover - GPU machine only
    r = _checks().megatron_check("cuda")
    assert r["ok"], r
    assert math.isfinite(r["loss"]) and r["weights_max_change"] > 0
    assert r["resume"]["step"] == 1 and r["resume"]["loaded_weights_max_diff"] == 0.0
    # same step from the same state on the same GPU: bf16 kernels may differ in the last bit only
    assert r["resume"]["second_step_weights_max_diff"] < 1e-2


def test_megatron_gpt_matches_the_hf_model_on_cpu(tmp_path):
    """The adapter's megatron-core GPTModel with converted weights computes the Hugging Face
    model's logits (in a subprocess: it initialises torch.distributed). Runs where megatron-core
    imports, e.g. ROLLART_MCORE_PATH=<pip install --target dir of megatron-core 0.16>."""
    env = dict(os.environ)
    if os.environ.get("ROLLART_MCORE_PATH"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ["ROLLART_MCORE_PATH"], env.get("PYTHONPATH")) if p)
    out = tmp_path / "mcore.json"
    proc = subprocess.run([sys.executable, str(CHECKS_PATH), "megatron-cpu", "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=300)
    r = json.loads(out.read_text())
    if r.get("skipped"):
        pytest.skip(f"megatron-core GPTModel on CPU: {r['reason']} (set ROLLART_MCORE_PATH to a folder holding it)")
    assert proc.returncode == 0 and r["ok"], r
    assert r["logits_max_diff_vs_hf"] < 1e-4 and r["weights_roundtrip_max_diff"] == 0.0


def test_megatron_check_reports_why_it_cannot_run():
    if MEGATRON_OK:
        pytest.skip("megatron-core and CUDA are here; the GPU test runs instead")
    r = _checks().megatron_check("cuda")
    assert r == {"ok": False, "skipped": True, "reason": MEGATRON_WHY}


def test_digits_in_process_on_cpu():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    r = _checks().digits_check(device, steps=2, groups=2, group_size=4, max_new_tokens=8)
    assert r["ok"], r
    assert len(r["steps"]) == 2 and all(0.0 <= h["reward_mean"] <= 1.0 for h in r["steps"])
    assert all(math.isfinite(h["loss"]) and h["tokens"] > 0 for h in r["steps"])
    # the engine generated with the trainer's weights: the first step is on-policy
    assert r["ratio_first_step"] == pytest.approx(1.0, abs=1e-4)
    assert r["weights_max_change"] > 0 and r["engine_vs_trainer_max_diff"] == 0.0
