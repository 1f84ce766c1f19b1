"""The GPU engine: vLLM's ``LLMEngine`` behind the :class:`~rollart.runtime.engines.base.Engine`
interface.

vLLM is imported lazily (it needs CUDA); :func:`available` says whether it can run here.

* The engine runs **in process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before vLLM
  is imported), so ``step()`` is synchronous — one scheduler iteration, as the worker's
  command loop expects — and weights are handed to the model by reference.
* ``add`` → ``LLMEngine.add_request`` with a ``{"prompt_token_ids": ...}`` prompt and
  ``SamplingParams(max_tokens, temperature, seed, logprobs=0, stop_token_ids, detokenize=False,
  output_kind=DELTA)``; ``abort`` → ``abort_request``; ``step`` → ``LLMEngine.step`` with the
  deltas accumulated per request until it finishes. Log-probs are vLLM's sampled-token
  log-probs; when the installed vLLM has ``logprobs_mode`` they are the processed ones
  (after temperature), the same convention as :class:`TorchEngine`.
* A :class:`ModelSpec` is written out as a Qwen3 ``config.json`` in a temporary folder and
  loaded with ``load_format="dummy"`` (random weights, nothing downloaded); a folder path
  loads that model (``load_format`` as given).
* ``load_weights(state)`` loads Hugging Face-named tensors through the model's own
  ``load_weights`` (``LLMEngine.apply_model``, or ``collective_rpc`` on older versions), then
  recomputes the KV of every unfinished request: each is aborted inside vLLM, the prefix cache
  is reset (no block computed with the old weights survives), and it is re-added under a new
  internal id with prompt + tokens so far as its prompt and the remaining token budget. The
  caller sees one request whose later tokens come from the new weights.
* ``state_dict()`` returns vLLM's parameters by *its* names (fused ``qkv_proj`` /
  ``gate_up_proj``), which ``load_weights`` of a Hugging Face model does not accept.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from rollart.plan.schema import ModelSpec
from rollart.runtime.engines.base import Completion


def available() -> tuple[bool, str]:
    """``(True, "")`` when vLLM is installed and a CUDA device is visible, else ``(False, why)``."""
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed (it needs CUDA: pip install 'rollart[gpu]' on a GPU machine)"
    try:
        import torch
    except ImportError:  # pragma: no cover - vllm depends on torch
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device: the vLLM engine needs a GPU"
    return True, ""


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    seed: Optional[int]
    vid: str                                  # the id vLLM knows it by (changes on recompute)
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    restarts: int = 0


class VllmEngine:
    name = "vllm"

    def __init__(self, spec: ModelSpec | str | Path, tokenizer: Any = None, seed: int = 0, dtype: str = "bfloat16",
                 max_batch: int = 256, max_model_len: int = 8192, gpu_memory_utilization: float = 0.85,
                 tensor_parallel_size: int = 1, enable_prefix_caching: bool = True,
                 stop_token_ids: Optional[Iterable[int]] = None, load_format: Optional[str] = None,
                 **engine_args: Any):
        ok, why = available()
        if not ok:
            raise RuntimeError(why)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import dataclasses

        from vllm import EngineArgs, LLMEngine

        self.tokenizer, self.seed = tokenizer, int(seed)
        self._tmp: Optional[tempfile.TemporaryDirectory] = None
        model_dir, fmt = self._model_dir(spec, max_model_len)
        if stop_token_ids is None:
            from rollart.runtime.engines.tokenizer import stop_token_ids as _stops

            stop_token_ids = _stops(tokenizer) if tokenizer is not None else []
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        kwargs: dict[str, Any] = dict(
            model=model_dir, load_format=load_format or fmt, dtype=dtype, seed=self.seed, skip_tokenizer_init=True,
            max_model_len=int(max_model_len), max_num_seqs=int(max_batch), tensor_parallel_size=int(tensor_parallel_size),
            gpu_memory_utilization=float(gpu_memory_utilization), enable_prefix_caching=bool(enable_prefix_caching),
        )
        names = {f.name for f in dataclasses.fields(EngineArgs)}
        if "logprobs_mode" in names:
            kwargs["logprobs_mode"] = "processed_logprobs"
        if "disable_log_stats" in names:
            kwargs["disable_log_stats"] = True
        kwargs.update(engine_args)
        self.engine_args = kwargs
        self._llm = LLMEngine.from_engine_args(EngineArgs(**kwargs))
        self._reqs: dict[str, _Req] = {}
        self._by_vid: dict[str, str] = {}
        self._arrivals = 0
        self.counters = {"steps": 0, "generated_tokens": 0, "finished": 0, "aborted": 0, "weight_loads": 0,
                         "recomputed_requests": 0, "recomputed_tokens": 0}

    # ------------------------------------------------------------------ setup

    def _model_dir(self, spec: ModelSpec | str | Path, max_model_len: int) -> tuple[str, str]:
        """A folder vLLM can load, and the load format that goes with it."""
        from rollart.calibration.profile_engine import hf_config_dict

        if not isinstance(spec, ModelSpec):
            path = Path(str(spec))
            if path.exists():
                return str(path if path.is_dir() else path.parent), "auto"
            spec = ModelSpec.model_validate(str(spec))
        self._tmp = tempfile.TemporaryDirectory(prefix="rollart-vllm-")
        cfg = hf_config_dict(spec, max(int(max_model_len), 32768))
        for key, tok in (("eos_token_id", "<|im_end|>"), ("pad_token_id", "<|endoftext|>")):
            if self.tokenizer is not None:
                cfg[key] = self.tokenizer.convert_tokens_to_ids(tok)
        (Path(self._tmp.name) / "config.json").write_text(json.dumps(cfg, indent=2))
        return self._tmp.name, "dummy"

    def _params(self, req: _Req) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        seed = req.seed
        if seed is not None and req.restarts:
            seed = (seed * 1_000_003 + req.restarts) % (2 ** 31)  # a fresh stream for the continuation
        return SamplingParams(max_tokens=req.max_new_tokens - len(req.out), temperature=req.temperature,
                              seed=seed, logprobs=0, stop_token_ids=list(self.stop_token_ids), detokenize=False,
                              output_kind=RequestOutputKind.DELTA)

    def _submit(self, req: _Req) -> None:
        self._by_vid[req.vid] = req.rid
        prompt = {"prompt_token_ids": req.prompt + req.out}
        returned = self._llm.add_request(req.vid, prompt, self._params(req))
        if isinstance(returned, str) and returned != req.vid:  # newer vLLM may rename the request
            self._by_vid[returned] = req.rid

    # ------------------------------------------------------------------ the Engine interface

    def add(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, temperature: float = 1.0,
            seed: int | None = None) -> None:
        rid = str(request_id)
        if rid in self._reqs:
            raise ValueError(f"request '{rid}' is already in the engine")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError(f"request '{rid}': the prompt is empty")
        self._arrivals += 1
        if seed is None:
            seed = (self.seed * 1_000_003 + self._arrivals) % (2 ** 31)
        req = _Req(rid, prompt, max(1, int(max_new_tokens)), float(temperature), seed, vid=rid)
        self._reqs[rid] = req
        self._submit(req)

    def abort(self, request_id: str) -> bool:
        req = self._reqs.pop(str(request_id), None)
        if req is None:
            return False
        self._llm.abort_request([req.vid])
        self.counters["aborted"] += 1
        return True

    def has_work(self) -> bool:
        return bool(self._reqs)

    def step(self) -> list[Completion]:
        done = []
        for out in self._llm.step():
            rid = self._by_vid.get(out.request_id)
            req = self._reqs.get(rid) if rid is not None else None
            if req is None:
                continue  # an output of a request aborted (or re-added after a weight update) meanwhile
            comp = out.outputs[0]
            new = list(comp.token_ids)
            req.out.extend(new)
            req.logprobs.extend(_sampled_logprobs(comp.logprobs, new))
            self.counters["generated_tokens"] += len(new)
            if out.finished:
                self._reqs.pop(req.rid, None)
                self._by_vid = {v: r for v, r in self._by_vid.items() if r != req.rid}
                reason = comp.finish_reason or "length"
                done.append(self._completion(req, "stop" if reason == "stop" else reason))
                self.counters["finished"] += 1
        self.counters["steps"] += 1
        return done

    def load_weights(self, state: Mapping[str, Any]) -> None:
        import torch

        tensors = [(k, v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in state.items()]

        def _load(model: Any) -> int:
            model.load_weights(weights=iter(tensors))
            return len(tensors)

        self._apply_model(_load)
        self.counters["weight_loads"] += 1
        # Recompute the KV of everything unfinished under the new weights.
        unfinished = list(self._reqs.values())
        if unfinished:
            self._llm.abort_request([r.vid for r in unfinished])
        self._llm.reset_prefix_cache()
        self._by_vid = {}
        for req in unfinished:
            req.restarts += 1
            req.vid = f"{req.rid}#w{req.restarts}"
            self.counters["recomputed_requests"] += 1
            self.counters["recomputed_tokens"] += len(req.prompt) + len(req.out)
            self._submit(req)

    def state_dict(self) -> dict[str, Any]:
        def _cpu_state(model: Any) -> dict[str, Any]:
            return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

        return self._apply_model(_cpu_state)

    # ------------------------------------------------------------------ extras

    def partial(self, request_id: str) -> Optional[Completion]:
        req = self._reqs.get(str(request_id))
        return None if req is None else self._completion(req, "abort")

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "unfinished": len(self._reqs)}

    def close(self) -> None:
        self._llm = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _apply_model(self, fn: Any) -> Any:
        if hasattr(self._llm, "apply_model"):
            return self._llm.apply_model(fn)[0]
        return self._llm.collective_rpc(lambda worker: fn(worker.model_runner.get_model()))[0]

    def _completion(self, req: _Req, reason: str) -> Completion:
        text = self.tokenizer.decode(req.out, skip_special_tokens=True) if self.tokenizer is not None and req.out else ""
        return Completion(req.rid, list(req.out), text, list(req.logprobs), reason)


def _sampled_logprobs(logprobs: Any, tokens: list[int]) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position ``{token_id: Logprob}``."""
    if not logprobs:
        return [float("nan")] * len(tokens)
    out = []
    for pos, tok in zip(logprobs, tokens):
        entry = pos.get(tok) if hasattr(pos, "get") else None
        out.append(float(getattr(entry, "logprob", entry)) if entry is not None else float("nan"))
    return out


__all__ = ["VllmEngine", "available"]
