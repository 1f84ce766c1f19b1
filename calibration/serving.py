"""The composed GPU model against measured end-to-end serving throughput.

The kernel profiles are fitted to single-kernel timings; a serving engine's step also pays the
iteration overhead and whatever the composition leaves out. ``data/infersim/serving.yaml`` holds the
only end-to-end figures published beside the kernel data (SGLang on H20, a dense FP8 model and a
BF16 MoE served with data-parallel attention and expert parallelism). Nothing is fitted to them:

    python -m rollart.calibration.serving     # measured vs predicted tokens per GPU per second
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from rollart.calibration.datasets import INFERSIM
from rollart.calibration.profiles import KernelProfile
from rollart.plan.schema import ModelSpec

SERVING_FILE = INFERSIM / "serving.yaml"
HF_CONFIGS = INFERSIM / "hf_configs"


def model_from_hf_config(path: Path, weight_dtype: str = "bf16") -> ModelSpec:
    """A ``ModelSpec`` from a shipped Hugging Face ``config.json``, served in ``weight_dtype``."""
    from rollart.calibration.profile_engine import spec_from_hf_config

    spec = spec_from_hf_config(json.loads(path.read_text()), name=path.name.removesuffix("_config.json"))
    return ModelSpec.model_validate({**spec.model_dump(), "weight_dtype": weight_dtype})


@dataclass(frozen=True)
class ServingCheck:
    model: str
    weight_dtype: str
    gpu: str
    phase: str
    setup: str
    measured_tgs: float
    predicted_tgs: float
    infersim_tgs: float

    @property
    def error(self) -> float:
        """Predicted ÷ measured − 1 (positive: the model is too fast)."""
        return self.predicted_tgs / self.measured_tgs - 1.0


def _predict(row: dict, model: ModelSpec, profile: KernelProfile | None) -> tuple[float, str]:
    from rollart.calibration import generation_cost
    from rollart.calibration.cost import KernelProfileGeneration
    from rollart.plan.presets import GPU_PRESETS
    from rollart.plan.schema import GpuType

    gpu, gpus = row["gpu"], int(row["gpus"])
    sheet = GpuType(**GPU_PRESETS[gpu])

    def cost(ep: int = 1):  # noqa: ANN202
        if profile is None:
            return generation_cost(model, gpu, sheet, gpus, ep=ep)
        return KernelProfileGeneration(model, sheet, gpus, profile, "given", ep)

    if row["phase"] == "prefill":
        tokens, seq = int(row["step_tokens"]), int(row["input_tokens"])
        step = cost().prefill_time(tokens, tokens // seq * seq * seq / 2)
        return tokens / step / gpus, f"{gpus} GPU, steps of {tokens:,} tokens ({tokens // seq} × {seq:,})"
    ep, per_gpu = int(row.get("ep", 1)), int(row["batch_per_gpu"])
    batch = per_gpu * gpus
    context = int(row["input_tokens"]) + int(row["output_tokens"]) // 2
    step = cost(ep).decode_line(batch).total(batch * context, batch, 1)
    par = (f"attention data-parallel, experts over {ep} ranks" if ep == gpus > 1
           else f"tp {gpus}" + (f", ep {ep}" if ep > 1 else ""))
    return per_gpu / step, f"{gpus} GPU ({par}), {per_gpu} sequences a GPU, {context:,} cached tokens each"


def serving_checks(path: Path = SERVING_FILE, profiles: dict[str, KernelProfile] | None = None) -> list[ServingCheck]:
    """Each measured setup with the composed model's prediction: the shipped profile of its GPU, or
    ``profiles[gpu]`` where given (to compare a variant of a profile)."""
    out = []
    for row in yaml.safe_load(path.read_text())["measurements"]:
        model = model_from_hf_config(HF_CONFIGS / row["model"], row["weight_dtype"])
        predicted, setup = _predict(row, model, (profiles or {}).get(row["gpu"]))
        out.append(ServingCheck(model.name, row["weight_dtype"], row["gpu"], row["phase"], setup, float(row["tgs"]),
                                predicted, float(row["infersim_tgs"])))
    return out


def main() -> None:
    print("SGLang on H20, measured (InferSim README) vs the shipped profiles composed; tokens per GPU per second")
    print(f"{'model':14} {'dtype':5} {'phase':8} {'measured':>9} {'rollart':>9} {'error':>7} {'InferSim':>9}  setup")
    for c in serving_checks():
        print(f"{c.model:14} {c.weight_dtype:5} {c.phase:8} {c.measured_tgs:9,.0f} {c.predicted_tgs:9,.0f} "
              f"{c.error:+7.1%} {c.infersim_tgs:9,.0f}  {c.setup}")


if __name__ == "__main__":
    main()
