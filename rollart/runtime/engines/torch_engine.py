"""A continuous-batching engine over the torch Qwen3 of :mod:`rollart.runtime.qwen3` (the CPU path).

:class:`TorchEngine` holds a random-init Qwen3 built from a :class:`ModelSpec` (the same model
``rollart calibrate profile`` measures) and implements :class:`~rollart.runtime.engines.base.Engine`:

* ``add`` queues a request; ``step`` runs one engine iteration:

  1. **prefill** queued requests (new ones, and ones whose KV was dropped by a weight update),
     up to ``max_batch`` running in all. Requests whose context has the same length run as
     one batched forward (a GRPO group shares its prompt); a prefill computes the whole
     context and samples the request's next token from its last position.
  2. **decode** one token for every request that was already running: one batched forward
     over a shared KV cache. Rows are left-padded to the longest context; the padding is
     masked out and each row carries its own position ids, so a row computes exactly what
     it would alone (the tests compare every recorded log-prob to a full forward).
  3. drop the rows that finished and merge the rows just prefilled into the batch.

  Every running request gains exactly one token per step.
* Sampling: temperature ``T > 0`` samples from ``softmax(logits / T)`` with a per-request
  ``torch.Generator`` (seeded by the request's ``seed``, or by the engine seed and the
  request's arrival order), so a run is reproducible; ``T = 0`` is greedy. The recorded
  log-prob of each token is under the distribution it was sampled from (``logits / T``;
  the raw logits when greedy) — the behaviour policy.
* A request stops at a stop token (``<|im_end|>`` / ``<|endoftext|>`` of the tokenizer, or
  ``stop_token_ids``; the stop token is kept in ``token_ids``, not in ``text``) with
  ``finish_reason="stop"``, or after ``max_new_tokens`` / at ``max_model_len`` with
  ``"length"``.
* ``load_weights`` replaces the weights between steps (a mapping of Hugging Face names to
  tensors or arrays; a subset of the parameters is accepted) and drops the KV of every running
  request; those requests are prefilled again over their full context (prompt + tokens so
  far) at the next step, so every later token comes from the new weights.
* ``threads``: torch intra-op threads (process-wide). One thread is fastest for the tiny
  model on a small CPU: its matrices are too small to amortise the thread hand-offs, and on
  a loaded 2-core machine two threads were ~30x slower per step than one.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from rollart.plan.schema import ModelSpec
from rollart.runtime.engines.base import Completion


@dataclass
class _Request:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    generator: Any                      # torch.Generator
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    recompute: bool = False             # queued for a prefill after a weight update

    @property
    def context_len(self) -> int:
        return len(self.prompt) + len(self.out)


class TorchEngine:
    """Continuous batching on a torch Qwen3 (see the module docstring)."""

    name = "torch"

    def __init__(self, spec: ModelSpec | str, tokenizer: Any = None, device: str = "cpu", dtype: Any = "fp32",
                 seed: int = 0, max_batch: int = 32, max_model_len: int = 32768,
                 stop_token_ids: Optional[Iterable[int]] = None, threads: Optional[int] = None,
                 model: Any = None):
        import torch

        from rollart.calibration.profile_engine import build_model, torch_dtype

        if isinstance(spec, str):
            spec = ModelSpec.model_validate(spec)
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.spec, self.tokenizer, self.device = spec, tokenizer, torch.device(device)
        self.seed, self.max_batch, self.max_model_len = int(seed), int(max_batch), int(max_model_len)
        self.model = model if model is not None else build_model(spec, dtype, str(device), seed,
                                                                 max_positions=self.max_model_len)
        self.model.eval()
        self._dtype = torch_dtype(dtype)
        if stop_token_ids is None:
            from rollart.runtime.engines.tokenizer import stop_token_ids as _stops

            stop_token_ids = _stops(tokenizer) if tokenizer is not None else []
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self._waiting: OrderedDict[str, _Request] = OrderedDict()
        self._rows: list[_Request] = []      # running requests, in batch-row order
        self._cache: Any = None              # KVCache over the rows (left-padded)
        self._mask: Any = None               # bool [rows, cached length]: True where a row has a token
        self._arrivals = 0
        self.last_step: dict[str, float] = {}
        self.counters = {"steps": 0, "prefill_forwards": 0, "prefill_requests": 0, "prefill_tokens": 0,
                         "decode_forwards": 0,
                         "decode_tokens": 0, "generated_tokens": 0, "finished": 0, "aborted": 0,
                         "recomputed_requests": 0, "recomputed_tokens": 0, "weight_loads": 0,
                         "step_seconds": 0.0}

    # ------------------------------------------------------------------ the Engine interface

    def add(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, temperature: float = 1.0,
            seed: int | None = None) -> None:
        import torch

        rid = str(request_id)
        if rid in self._waiting or any(r.rid == rid for r in self._rows):
            raise ValueError(f"request '{rid}' is already in the engine")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError(f"request '{rid}': the prompt is empty (it needs at least one token)")
        vocab = self.spec.vocab
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"request '{rid}': token ids must be in [0, {vocab})")
        if temperature < 0 or not math.isfinite(temperature):
            raise ValueError(f"request '{rid}': temperature must be ≥ 0, got {temperature}")
        self._arrivals += 1
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(seed) if seed is not None else (self.seed * 1_000_003 + self._arrivals) % (2 ** 63))
        self._waiting[rid] = _Request(rid, prompt, max(0, int(max_new_tokens)), float(temperature), gen)

    def abort(self, request_id: str) -> bool:
        rid = str(request_id)
        if self._waiting.pop(rid, None) is not None:
            self.counters["aborted"] += 1
            return True
        for i, r in enumerate(self._rows):
            if r.rid == rid:
                self._drop_rows([i])
                self.counters["aborted"] += 1
                return True
        return False

    def has_work(self) -> bool:
        return bool(self._waiting or self._rows)

    def step(self) -> list[Completion]:
        import torch

        t0 = time.perf_counter()
        done: list[Completion] = []
        prefill_tokens, admitted = self.counters["prefill_tokens"], self.counters["prefill_requests"]
        forwards, finished_before = self.counters["prefill_forwards"], self.counters["finished"]
        with torch.inference_mode():
            decode_rows = list(self._rows)
            decode_kv = sum(r.context_len for r in decode_rows)
            # the batch's KV is left-padded to its longest row: attention reads rows × that length
            padded = len(decode_rows) * (self._mask.shape[1] + 1) if decode_rows else 0
            new_rows, new_kv = self._prefill(done)
            if decode_rows:
                finished = self._decode(done)
                if finished:
                    self._drop_rows(finished)
            if new_rows:
                self._merge(new_rows, new_kv)
        seconds = time.perf_counter() - t0
        self.counters["steps"] += 1
        self.counters["step_seconds"] += seconds
        # what this step computed, for profiling the engine where it runs (InferenceWorker.step_log)
        self.last_step = {"prefill_requests": self.counters["prefill_requests"] - admitted,
                          "prefill_tokens": self.counters["prefill_tokens"] - prefill_tokens,
                          "prefill_forwards": self.counters["prefill_forwards"] - forwards,
                          "finished": self.counters["finished"] - finished_before,
                          "decode_rows": len(decode_rows), "decode_kv": decode_kv, "decode_padded": padded,
                          "seconds": seconds}
        return done

    def load_weights(self, state: Mapping[str, Any]) -> None:
        import torch

        params = dict(self.model.state_dict())
        unexpected = [k for k in state if k not in params]
        if unexpected:
            raise KeyError(f"load_weights: unknown parameter names {unexpected[:5]}"
                           f"{' …' if len(unexpected) > 5 else ''}")
        with torch.no_grad():
            for k, v in state.items():
                t = v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
                if tuple(t.shape) != tuple(params[k].shape):
                    raise ValueError(f"load_weights: {k} has shape {tuple(t.shape)}, "
                                     f"the model expects {tuple(params[k].shape)}")
                params[k].copy_(t)
        self.counters["weight_loads"] += 1
        # Every running request's KV came from the old weights: prefill them again, first in line.
        if self._rows:
            again = OrderedDict((r.rid, r) for r in self._rows)
            for r in again.values():
                r.recompute = True
            again.update(self._waiting)
            self._waiting = again
            self._rows, self._cache, self._mask = [], None, None

    def state_dict(self) -> dict[str, Any]:
        """A CPU copy of the weights (Hugging Face parameter names)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------------ extras (not in Engine)

    def partial(self, request_id: str) -> Optional[Completion]:
        """What a queued or running request has generated so far (None if unknown)."""
        rid = str(request_id)
        req = self._waiting.get(rid) or next((r for r in self._rows if r.rid == rid), None)
        return None if req is None else self._completion(req, "abort")

    def num_running(self) -> int:
        return len(self._rows)

    def num_waiting(self) -> int:
        return len(self._waiting)

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "running": len(self._rows), "waiting": len(self._waiting)}

    # ------------------------------------------------------------------ internals

    def _completion(self, req: _Request, reason: str) -> Completion:
        text = ""
        if self.tokenizer is not None and req.out:
            text = self.tokenizer.decode(req.out, skip_special_tokens=True)
        return Completion(req.rid, list(req.out), text, list(req.logprobs), reason)

    def _finish_reason(self, req: _Request) -> Optional[str]:
        if req.out and req.out[-1] in self.stop_token_ids:
            return "stop"
        if len(req.out) >= req.max_new_tokens or req.context_len >= self.max_model_len:
            return "length"
        return None

    def _sample(self, logits: Any, reqs: list[_Request]) -> None:
        """Sample one token per row of ``logits`` [n, vocab] and append it to each request."""
        import torch

        logits = logits.float()
        temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in reqs]).unsqueeze(1)
        logp = torch.log_softmax(logits / temps.to(logits.device), dim=-1).cpu()
        probs = logp.exp()
        for i, r in enumerate(reqs):
            if r.temperature > 0:
                tok = int(torch.multinomial(probs[i], 1, generator=r.generator))
            else:
                tok = int(torch.argmax(logp[i]))
            r.out.append(tok)
            r.logprobs.append(float(logp[i, tok]))
        self.counters["generated_tokens"] += len(reqs)

    def _prefill(self, done: list[Completion]) -> tuple[list[_Request], list[tuple[Any, Any]]]:
        """Prefill queued requests while there is room; returns the ones still running and
        their KV (one ``[1, heads, len, dim]`` key/value pair per layer each)."""
        import torch

        from rollart.runtime.qwen3 import KVCache

        room = self.max_batch - len(self._rows)
        admitted: list[_Request] = []
        while self._waiting and len(admitted) < room:
            _, req = self._waiting.popitem(last=False)
            if req.max_new_tokens == 0 or req.context_len >= self.max_model_len:
                done.append(self._completion(req, "length"))
                self.counters["finished"] += 1
                continue
            admitted.append(req)
        if not admitted:
            return [], []
        groups: OrderedDict[int, list[_Request]] = OrderedDict()
        for req in admitted:
            groups.setdefault(req.context_len, []).append(req)
        keep, kv = [], []
        for length, reqs in groups.items():
            ids = torch.tensor([r.prompt + r.out for r in reqs], dtype=torch.long, device=self.device)
            cache = KVCache()
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            self.counters["prefill_forwards"] += 1
            self.counters["prefill_requests"] += len(reqs)
            self.counters["prefill_tokens"] += length * len(reqs)
            for r in reqs:
                if r.recompute:
                    self.counters["recomputed_requests"] += 1
                    self.counters["recomputed_tokens"] += length
                    r.recompute = False
            self._sample(out.logits[:, -1, :], reqs)
            layers = [(layer.keys, layer.values) for layer in out.cache.layers]
            for i, r in enumerate(reqs):
                reason = self._finish_reason(r)
                if reason:
                    done.append(self._completion(r, reason))
                    self.counters["finished"] += 1
                    continue
                keep.append(r)
                kv.append([(k[i:i + 1], v[i:i + 1]) for k, v in layers])
        return keep, kv

    def _decode(self, done: list[Completion]) -> list[int]:
        """One token for every running row; returns the rows that finished."""
        import torch

        rows = self._rows
        n = len(rows)
        ids = torch.tensor([[r.out[-1]] for r in rows], dtype=torch.long, device=self.device)
        pos = torch.tensor([[r.context_len - 1] for r in rows], dtype=torch.long, device=self.device)
        self._mask = torch.cat([self._mask, torch.ones(n, 1, dtype=torch.bool, device=self.device)], dim=1)
        out = self.model(input_ids=ids, attention_mask=self._mask, position_ids=pos, cache=self._cache,
                         use_cache=True, logits_to_keep=1)
        self._cache = out.cache
        self.counters["decode_forwards"] += 1
        self.counters["decode_tokens"] += n
        self._sample(out.logits[:, -1, :], rows)
        finished = []
        for i, r in enumerate(rows):
            reason = self._finish_reason(r)
            if reason:
                done.append(self._completion(r, reason))
                self.counters["finished"] += 1
                finished.append(i)
        return finished

    def _drop_rows(self, drop: list[int]) -> None:
        import torch

        gone = set(drop)
        keep = [i for i in range(len(self._rows)) if i not in gone]
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self._mask.index_select(0, idx)
        # Columns that are padding in every remaining row can go.
        first = int(mask.any(dim=0).to(torch.int8).argmax())
        self._mask = mask[:, first:]
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, first:]
            layer.values = layer.values.index_select(0, idx)[:, :, first:]

    def _merge(self, reqs: list[_Request], kv: list[list[tuple[Any, Any]]]) -> None:
        """Append prefilled rows to the running batch (left-padding everyone to one length)."""
        import torch
        import torch.nn.functional as F

        from rollart.runtime.qwen3 import KVCache

        old_len = self._mask.shape[1] if self._mask is not None else 0
        new_lens = [r.context_len - 1 for r in reqs]   # the cache holds all but the last token
        length = max([old_len, *new_lens])
        masks, layers = [], []
        if self._rows:
            masks.append(F.pad(self._mask, (length - old_len, 0), value=False))
        for n in new_lens:
            m = torch.zeros(1, length, dtype=torch.bool, device=self.device)
            m[:, length - n:] = True
            masks.append(m)
        for li in range(len(kv[0])):
            ks, vs = [], []
            if self._rows:
                layer = self._cache.layers[li]
                ks.append(F.pad(layer.keys, (0, 0, length - old_len, 0)))
                vs.append(F.pad(layer.values, (0, 0, length - old_len, 0)))
            for row, n in zip(kv, new_lens):
                k, v = row[li]
                ks.append(F.pad(k, (0, 0, length - n, 0)))
                vs.append(F.pad(v, (0, 0, length - n, 0)))
            layers.append((torch.cat(ks, dim=0), torch.cat(vs, dim=0)))
        self._cache = KVCache.from_layers(layers)
        self._mask = torch.cat(masks, dim=0)
        self._rows = self._rows + list(reqs)


__all__ = ["TorchEngine"]
