"""A handed checkpoint is data, never code: every checkpoint loader refuses a malicious pickle
(one whose unpickling would run a command) with a clear error, and the payload never runs."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rollart.plan.schema import ModelSpec  # noqa: E402
from rollart.runtime.qwen3 import ROPE_THETA  # noqa: E402
from rollart.runtime.trainer import grpo  # noqa: E402
from rollart.runtime.trainer.grpo import GRPOTrainer, UnsafeCheckpoint  # noqa: E402

FILES = ("model.pt", "optim.pt", "rng.pt")


class _Payload:
    """Unpickling this would create ``marker`` (what an attacker's os.system would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _poison(ckpt: Path, name: str, marker: Path) -> None:
    torch.save({"state": _Payload(marker), "t": torch.zeros(2)}, ckpt / name)


@pytest.mark.parametrize("name", FILES)
def test_the_grpo_trainer_refuses_a_malicious_checkpoint_file(tmp_path: Path, name: str) -> None:
    trainer = GRPOTrainer(ModelSpec.model_validate("Qwen3-tiny"), lr=1e-3, seed=0)
    ckpt = trainer.save_checkpoint(tmp_path / "ck")
    marker = tmp_path / "pwned"
    _poison(ckpt, name, marker)
    with pytest.raises(UnsafeCheckpoint, match=rf"{name}: refusing to load") as err:
        trainer.load_checkpoint(tmp_path / "ck")
    assert "\n" not in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("name", FILES)
def test_the_megatron_trainer_refuses_a_malicious_checkpoint_file(tmp_path: Path, name: str, monkeypatch) -> None:
    from rollart.runtime.trainer import megatron as mg

    # no GPU/megatron-core here: the loader runs on a stand-in trainer up to its torch.load calls
    for mod in ("megatron", "megatron.core", "megatron.core.tensor_parallel", "megatron.core.tensor_parallel.random"):
        monkeypatch.setitem(sys.modules, mod, sys.modules.get(mod) or types.ModuleType(mod))
    monkeypatch.setattr(sys.modules["megatron.core.tensor_parallel.random"], "get_cuda_rng_tracker", lambda: None,
                        raising=False)
    spec = ModelSpec.model_validate("Qwen3-tiny")
    ckpt = tmp_path / "ck" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"format": grpo.CHECKPOINT_FORMAT, "trainer": mg.MegatronTrainer.name,
                                                "step": 1, "version": 1, "spec": spec.model_dump(),
                                                "rope_theta": ROPE_THETA}))
    for f in FILES:
        torch.save({"t": torch.zeros(1)}, ckpt / f)
    marker = tmp_path / "pwned"
    _poison(ckpt, name, marker)
    fake = types.SimpleNamespace(name=mg.MegatronTrainer.name, spec=spec,
                                 optimizer=types.SimpleNamespace(state_dict=lambda: {}),
                                 module=None, _load_mcore=lambda *a: None)
    with pytest.raises(Exception) as err:
        mg.MegatronTrainer.load_checkpoint(fake, ckpt)
    assert "Weights only load failed" in str(err.value) or "refusing to load" in str(err.value), err.value
    assert not marker.exists()


def test_a_plain_checkpoint_still_loads(tmp_path: Path) -> None:
    trainer = GRPOTrainer(ModelSpec.model_validate("Qwen3-tiny"), lr=1e-3, seed=0)
    trainer.save_checkpoint(tmp_path / "ck", step=3, version=3)
    assert trainer.load_checkpoint(tmp_path / "ck") == (3, 3)
    assert grpo._load  # the one loader every file of a torch checkpoint goes through


def test_a_checkpoint_with_another_rope_base_is_refused(tmp_path: Path) -> None:
    """Checkpoints written before the RoPE base was recorded came from a model at theta 10,000; resuming one
    on this model would silently give every position another meaning."""
    trainer = GRPOTrainer(ModelSpec.model_validate("Qwen3-tiny"), lr=1e-3, seed=0)
    path = trainer.save_checkpoint(tmp_path / "ck", step=2, version=2)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["rope_theta"] == ROPE_THETA
    del meta["rope_theta"]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="RoPE theta 10000; this model uses 1e\\+06"):
        trainer.load_checkpoint(tmp_path / "ck")
