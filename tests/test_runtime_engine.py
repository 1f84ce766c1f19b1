"""The CPU inference engine, its tokenizer and the inference worker's command loop.

Engine tests check what a batched, KV-cached, continuously batched run computes against a plain
full forward of the same model: every recorded log-prob must equal the one a single unbatched
forward gives for the same context (so padding, positions and cache merging are right), and
after a weight update the later tokens must be exactly what the *new* weights give for the
whole context (so the KV really was recomputed)."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from rollart.runtime.engines.base import Completion  # noqa: E402
from rollart.runtime.engines.tokenizer import (  # noqa: E402
    IM_END, SPECIAL_TOKENS, build_tokenizer, load_tokenizer, render_chat, stop_token_ids)
from rollart.runtime.engines.torch_engine import TorchEngine  # noqa: E402
from rollart.runtime.engines import vllm_engine  # noqa: E402
from rollart.runtime.inference_worker import InferenceWorker  # noqa: E402

VOCAB = 1024  # Qwen3-tiny


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for the tiny model (much faster on a small shared CPU); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(VOCAB)


def make_engine(tok, **kw) -> TorchEngine:
    kw.setdefault("seed", 0)
    return TorchEngine("Qwen3-tiny", tok, max_model_len=4096, **kw)


def prompts(n: int, lengths=(5, 12, 12, 30, 7, 19), seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


def run_all(engine: TorchEngine, max_steps: int = 10_000) -> dict[str, Completion]:
    out = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        out.update((c.request_id, c) for c in engine.step())
    raise AssertionError("engine did not drain")


def reference_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    """log p(token_j | prompt + tokens[:j]) from one full forward (no cache, no batch)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return [float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]


def favour_token(state: dict, token: int, vocab: int = VOCAB) -> dict:
    """Weights under which ``token`` follows any context with probability ≈ 1 (tied embeddings:
    every embedding row gets a constant +1 on coordinate 0, ``token``'s row +2; the blocks write
    nothing to the residual; the final norm keeps only coordinate 0, scaled ×100)."""
    s = {k: v.clone() for k, v in state.items()}
    emb = s["model.embed_tokens.weight"]
    emb[:, 0] = 1.0
    emb[token, 0] = 2.0
    for k in s:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            s[k].zero_()
    s["model.norm.weight"].zero_()
    s["model.norm.weight"][0] = 100.0
    if "lm_head.weight" in s:
        s["lm_head.weight"] = emb
    return s


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_specials_and_chat(tok, tmp_path) -> None:
    assert len(tok) == VOCAB
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tok.eos_token == IM_END and stop_token_ids(tok) == [2, 0]
    texts = ["", "What is 37 + 58? \\boxed{95}", "SFFF\nFHFH\nFFFH\nHFFG",
             "def f(x):\n    return x ** 2  # ünïcödé 日本語 🙂\t\r\n", "  leading and trailing  "]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess a number 1..100"}]
    chat = render_chat(msgs)
    assert chat.endswith("<|im_start|>assistant\n") and chat.count(IM_END) == 2
    ids = tok.encode(chat)
    assert ids[0] == 1 and ids.count(2) == 2 and tok.decode(ids) == chat
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == chat
    assert len(tok.encode("<|im_start|>assistant\nLEFT")) < len("<|im_start|>assistant\nLEFT")  # merges exist
    # deterministic, and saved/loaded offline through cache_dir
    again = build_tokenizer(VOCAB, cache_dir=tmp_path)
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    (folder,) = list(tmp_path.iterdir())
    loaded = load_tokenizer(folder)
    assert loaded.encode(chat) == ids and len(loaded) == VOCAB
    assert build_tokenizer(VOCAB, cache_dir=tmp_path).encode(chat) == ids  # the cached copy
    assert len(build_tokenizer(300)) == 300
    with pytest.raises(ValueError, match="too small"):
        build_tokenizer(100)


# ---------------------------------------------------------------- the engine


def test_concurrent_requests_match_a_full_forward(tok) -> None:
    eng = make_engine(tok, stop_token_ids=[])
    ps = prompts(6)
    for i in range(3):
        eng.add(f"r{i}", ps[i], 20 + i, temperature=1.0, seed=i)
    res: dict[str, Completion] = {}
    for _ in range(3):
        res.update((c.request_id, c) for c in eng.step())
    assert eng.num_running() == 3
    eng.add("r3", ps[3], 15, temperature=0.7, seed=3)   # joins a running batch (longer prompt)
    eng.add("r4", ps[4], 25, temperature=0.0)           # greedy
    eng.add("r5", ps[5], 1)
    res.update(run_all(eng))
    assert {k: len(c.token_ids) for k, c in res.items()} == {"r0": 20, "r1": 21, "r2": 22, "r3": 15, "r4": 25, "r5": 1}
    assert all(c.finish_reason == "length" for c in res.values())
    temps = {"r3": 0.7, "r4": 0.0}
    for i, p in enumerate(ps):
        c = res[f"r{i}"]
        ref = reference_logprobs(eng.model, p, c.token_ids, temps.get(c.request_id, 1.0))
        assert max(abs(a - b) for a, b in zip(ref, c.logprobs)) < 1e-4, c.request_id
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    with torch.inference_mode():
        logits = eng.model(input_ids=torch.tensor([ps[4] + res["r4"].token_ids])).logits[0]
    assert [int(logits[len(ps[4]) - 1 + j].argmax()) for j in range(25)] == res["r4"].token_ids
    s = eng.stats()
    assert s["generated_tokens"] == 104 and s["running"] == s["waiting"] == 0
    assert s["prefill_forwards"] == 5  # 6 requests, but r1 and r2 share a prompt length: one prefill


def test_seeded_results_are_reproducible_and_independent_of_the_batch(tok) -> None:
    ps = prompts(5)

    def run(seeds, order=range(5)):
        eng = make_engine(tok, stop_token_ids=[])
        for i in order:
            eng.add(f"r{i}", ps[i], 12, temperature=1.0, seed=seeds[i])
        return {k: c.token_ids for k, c in run_all(eng).items()}

    a = run([10, 11, 12, 13, 14])
    assert a == run([10, 11, 12, 13, 14])
    assert a == run([10, 11, 12, 13, 14], order=[4, 2, 0, 3, 1])
    alone = make_engine(tok, stop_token_ids=[])
    alone.add("r3", ps[3], 12, seed=13)
    assert run_all(alone)["r3"].token_ids == a["r3"]
    b = run([20, 21, 22, 23, 24])
    assert all(a[k] != b[k] for k in a)
    # without explicit seeds: the engine seed and the arrival order decide
    e1, e2 = make_engine(tok, seed=5), make_engine(tok, seed=5)
    for e in (e1, e2):
        e.add("x", ps[0], 8)
    assert run_all(e1)["x"].token_ids == run_all(e2)["x"].token_ids


def test_stop_token_ends_a_request(tok) -> None:
    eng = make_engine(tok)
    eng.load_weights(favour_token(eng.state_dict(), tok.convert_tokens_to_ids(IM_END)))
    eng.add("s", tok.encode(render_chat([{"role": "user", "content": "hi"}])), 50)
    (c,) = run_all(eng).values()
    assert c.finish_reason == "stop" and c.token_ids == [2] and c.text == ""
    assert c.logprobs[0] > -1e-3


def test_abort_removes_queued_and_running_requests(tok) -> None:
    eng = make_engine(tok, stop_token_ids=[], max_batch=3)
    ps = prompts(4)
    for i in range(4):
        eng.add(f"r{i}", ps[i], 30, seed=i)
    for _ in range(4):
        assert eng.step() == []
    assert eng.num_running() == 3 and eng.num_waiting() == 1
    part = eng.partial("r1")
    assert part is not None and len(part.token_ids) == 4 and part.finish_reason == "abort"
    assert eng.abort("r1") is True          # running: its row leaves the batch
    assert eng.abort("r3") is True          # still queued
    assert eng.abort("r1") is False and eng.abort("nope") is False
    assert eng.num_running() == 2 and eng.num_waiting() == 0
    res = run_all(eng)
    assert sorted(res) == ["r0", "r2"] and all(len(c.token_ids) == 30 for c in res.values())
    for i in (0, 2):  # the survivors' cache rows are intact after the batch shrank
        ref = reference_logprobs(eng.model, ps[i], res[f"r{i}"].token_ids)
        assert max(abs(a - b) for a, b in zip(ref, res[f"r{i}"].logprobs)) < 1e-4
    with pytest.raises(ValueError):
        eng.add("r0", [], 4)
    eng.add("dup", ps[0], 3)
    with pytest.raises(ValueError, match="already"):
        eng.add("dup", ps[0], 3)


def test_max_batch_caps_the_running_set(tok) -> None:
    eng = make_engine(tok, stop_token_ids=[], max_batch=2)
    for i, p in enumerate(prompts(5)):
        eng.add(f"r{i}", p, 6, seed=i)
    peak = 0
    res = {}
    while eng.has_work():
        res.update((c.request_id, c) for c in eng.step())
        peak = max(peak, eng.num_running())
    assert peak == 2 and len(res) == 5 and all(len(c.token_ids) == 6 for c in res.values())


def test_weight_update_mid_generation_recomputes_the_kv(tok) -> None:
    eng = make_engine(tok, stop_token_ids=[])
    ps = prompts(3)
    for i in range(3):
        eng.add(f"r{i}", ps[i], 24, seed=i)
    for _ in range(6):
        eng.step()
    old_model_state = eng.state_dict()
    new_state = TorchEngine("Qwen3-tiny", None, seed=99, max_model_len=4096).state_dict()  # other random weights
    eng.load_weights(new_state)
    assert eng.num_running() == 0 and eng.num_waiting() == 3
    res = run_all(eng)
    s = eng.stats()
    assert s["recomputed_requests"] == 3 and s["weight_loads"] == 1
    for i, p in enumerate(ps):
        c = res[f"r{i}"]
        assert len(c.token_ids) == 24
        # tokens 0..5 came from the old weights, 6.. from the new ones over the whole context
        eng.model.load_state_dict(old_model_state)
        before = reference_logprobs(eng.model, p, c.token_ids)[:6]
        eng.model.load_state_dict(new_state)
        after = reference_logprobs(eng.model, p, c.token_ids)[6:]
        assert max(abs(a - b) for a, b in zip(before + after, c.logprobs)) < 1e-4


def test_weight_update_makes_later_tokens_follow_the_new_weights(tok) -> None:
    eng = make_engine(tok, stop_token_ids=[])
    target = tok.convert_tokens_to_ids(tok.tokenize("LEFT"))[0]
    eng.add("a", prompts(1)[0], 40, seed=7)
    for _ in range(10):
        eng.step()
    head = list(eng.partial("a").token_ids)
    assert len(head) == 10 and head.count(target) < 10
    eng.load_weights(favour_token(eng.state_dict(), target))
    (c,) = run_all(eng).values()
    assert c.token_ids[:10] == head and c.token_ids[10:] == [target] * 30
    assert min(c.logprobs[10:]) > -1e-3
    assert eng.stats()["recomputed_requests"] == 1
    with pytest.raises(KeyError):
        eng.load_weights({"no.such.weight": torch.zeros(1)})


# ---------------------------------------------------------------- the worker loop, in process


def test_worker_applies_commands_in_order_between_steps(tok) -> None:
    async def scenario():
        w = InferenceWorker(engine_factory=lambda: make_engine(tok, stop_token_ids=[]), name="w")
        p = prompts(3)
        first = await asyncio.gather(w.generate("a", p[0], 8, 1.0, 1), w.generate("b", p[1], 5, 1.0, 2))
        assert [len(c.token_ids) for c in first] == [8, 5]
        await w.suspend()
        waiting = asyncio.ensure_future(w.generate("c", p[2], 6, 1.0, 3))
        doomed = asyncio.ensure_future(w.generate("d", p[2], 6, 1.0, 4))
        await asyncio.sleep(0.3)
        assert not waiting.done() and not doomed.done()
        assert (await w.stats())["suspended"] is True
        assert await w.abort("d") is True
        aborted = await doomed
        assert aborted.finish_reason == "abort" and aborted.token_ids == []
        state = favour_token(w._engine.state_dict(), 7)
        assert await w.update_weights(3, lambda: state) == 3   # a callable "pull"
        assert not waiting.done()
        await w.resume()
        c = await asyncio.wait_for(waiting, 10)
        assert c.token_ids == [7] * 6 and c.finish_reason == "length"
        assert await w.abort("c") is False
        long = asyncio.ensure_future(w.generate("e", p[0], 10_000, 1.0, 5))
        await asyncio.sleep(0.05)
        assert await w.abort("e") is True
        e = await long
        assert e.finish_reason == "abort" and len(e.token_ids) > 0
        with pytest.raises(ValueError):
            await w.generate("bad", [], 3)
        s = await w.stats()
        assert s["version"] == 3 and await w.version() == 3
        assert s["requests_served"] == 3 and s["requests_aborted"] == 2 and s["weight_updates"] == 1
        assert s["tokens_generated"] == 8 + 5 + 6 and s["busy_seconds"] > 0 and s["pending"] == 0
        await w.shutdown()
        with pytest.raises(RuntimeError, match="stopped"):
            await w.generate("late", p[0], 2)

    asyncio.run(scenario())


class _GatedEngine:
    """A stand-in engine whose first step waits for a gate: calls made meanwhile land in it."""

    name = "gated"

    def __init__(self):
        self.entered, self.gate = threading.Event(), threading.Event()
        self.queue: list[tuple[str, int]] = []
        self.last_step: dict[str, float] = {}

    def add(self, rid, prompt, max_new, temperature, seed):
        self.queue.append((rid, max_new))

    def abort(self, rid):
        return False

    def has_work(self):
        return bool(self.queue)

    def step(self):
        self.entered.set()
        assert self.gate.wait(10)
        rid, _ = self.queue.pop(0)
        self.last_step = {"prefill_requests": 1, "prefill_tokens": 4, "decode_rows": 0, "decode_kv": 0,
                          "decode_padded": 0, "finished": 1, "seconds": 0.0}
        return [Completion(rid, [5], "x", [-1.0], "length")]


def test_worker_records_steps_requests_and_the_calls_each_step_saw() -> None:
    async def scenario():
        engine = _GatedEngine()
        w = InferenceWorker(engine_factory=lambda: engine, name="w")
        assert await w.record_steps(True) == []
        first = asyncio.ensure_future(w.generate("a", [1, 2, 3, 4], 1))
        while not engine.entered.is_set():  # the engine is inside step 1, holding "a"
            await asyncio.sleep(0.005)
        second = asyncio.ensure_future(w.generate("b", [1, 2, 3, 4], 1))
        await asyncio.sleep(0.05)           # "b" arrives during step 1
        engine.gate.set()
        await asyncio.gather(first, second)
        requests = await w.request_log()
        steps = await w.record_steps(False)
        assert await w.request_log() == []  # recording stopped
        # step 1 saw b arrive (a's own arrival came before it); a's return races step 2
        assert steps[0]["call_events"] == 1 and steps[1]["call_events"] <= 1
        assert steps[0]["started"] <= steps[1]["started"]
        assert sorted(r["request"] for r in requests) == ["a", "b"]
        for r in requests:
            assert r["called"] <= r["added"] <= r["done"] <= r["returned"] and r["finish_reason"] == "length"
        assert w._request_times == {}       # nothing left behind
        await w.shutdown()

    asyncio.run(scenario())


# ---------------------------------------------------------------- vLLM


def test_vllm_engine_on_a_gpu() -> None:
    ok, why = vllm_engine.available()
    if not ok:
        pytest.skip(why)
    tok = build_tokenizer(VOCAB)  # pragma: no cover - GPU only
    eng = vllm_engine.VllmEngine("Qwen3-tiny", tok, max_model_len=1024, gpu_memory_utilization=0.3)
    for i, p in enumerate(prompts(4)):
        eng.add(f"r{i}", p, 12, seed=i)
    for _ in range(4):
        eng.step()
    eng.abort("r3")
    res = run_all(eng)  # type: ignore[arg-type]
    assert sorted(res) == ["r0", "r1", "r2"] and all(len(c.token_ids) == 12 for c in res.values())
    eng.add("w", prompts(1)[0], 30, seed=1)
    for _ in range(5):
        eng.step()
    hf = TorchEngine("Qwen3-tiny", tok, seed=0).state_dict()
    eng.load_weights(favour_token(hf, 7))
    (c,) = run_all(eng).values()  # type: ignore[arg-type]
    assert len(c.token_ids) == 30 and c.token_ids[-20:] == [7] * 20


def _fake_vllm(monkeypatch):
    """A stand-in for the slice of vLLM's API that VllmEngine uses (EngineArgs, LLMEngine,
    SamplingParams, RequestOutputKind), backed by a TorchEngine, so the adapter's bookkeeping
    (ids, deltas, aborts, recompute on a weight update) runs here without a GPU."""
    import dataclasses
    import enum
    import json
    import sys
    import types
    from pathlib import Path

    @dataclasses.dataclass
    class EngineArgs:
        model: str
        load_format: str = "auto"
        dtype: str = "auto"
        seed: int = 0
        skip_tokenizer_init: bool = False
        max_model_len: int = 0
        max_num_seqs: int = 256
        tensor_parallel_size: int = 1
        gpu_memory_utilization: float = 0.9
        enable_prefix_caching: bool = True
        logprobs_mode: str = "raw_logprobs"
        disable_log_stats: bool = False

    class RequestOutputKind(enum.Enum):
        CUMULATIVE, DELTA, FINAL_ONLY = 0, 1, 2

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    ns = types.SimpleNamespace

    class LLMEngine:
        def __init__(self, args):
            cfg = json.loads((Path(args.model) / "config.json").read_text())
            assert args.load_format == "dummy" and args.skip_tokenizer_init and cfg["vocab_size"] == VOCAB
            assert args.logprobs_mode == "processed_logprobs"
            self.args, self.resets, self.seen = args, 0, {}
            self.t = TorchEngine("Qwen3-tiny", None, seed=args.seed, stop_token_ids=[], max_model_len=4096)

        @classmethod
        def from_engine_args(cls, args):
            return cls(args)

        def add_request(self, vid, prompt, params):
            assert params.output_kind is RequestOutputKind.DELTA and params.logprobs == 0
            self.stops = set(params.stop_token_ids)
            self.t.add(vid, prompt["prompt_token_ids"], params.max_tokens, params.temperature, params.seed)
            self.seen[vid] = 0

        def abort_request(self, ids):
            for vid in ids:
                self.t.abort(vid)
                self.seen.pop(vid, None)

        def reset_prefix_cache(self):
            self.resets += 1
            return True

        def apply_model(self, fn):
            return [fn(ns(load_weights=lambda weights: self.t.load_weights(dict(weights)),
                          state_dict=lambda: self.t.model.state_dict()))]

        def step(self):
            done = {c.request_id: c for c in self.t.step()}
            outs = []
            for vid in list(self.seen):
                c = done.get(vid) or self.t.partial(vid)
                new, lps = c.token_ids[self.seen[vid]:], c.logprobs[self.seen[vid]:]
                self.seen[vid] = len(c.token_ids)
                fin = vid in done
                if fin:
                    del self.seen[vid]
                if new or fin:
                    outs.append(ns(request_id=vid, finished=fin, outputs=[ns(
                        token_ids=new, logprobs=[{t: ns(logprob=lp)} for t, lp in zip(new, lps)],
                        finish_reason=c.finish_reason if fin else None)]))
            return outs

    vllm = types.ModuleType("vllm")
    vllm.EngineArgs, vllm.LLMEngine, vllm.SamplingParams = EngineArgs, LLMEngine, SamplingParams
    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind, sp.SamplingParams = RequestOutputKind, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    monkeypatch.setattr(vllm_engine, "available", lambda: (True, ""))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def test_vllm_adapter_bookkeeping_on_a_stand_in(tok, monkeypatch) -> None:
    _fake_vllm(monkeypatch)
    eng = vllm_engine.VllmEngine("Qwen3-tiny", tok, seed=0, stop_token_ids=[])
    ps = prompts(4)
    for i in range(4):
        eng.add(f"r{i}", ps[i], 12, seed=i)
    for _ in range(4):
        eng.step()
    assert len(eng.partial("r3").token_ids) == 4
    assert eng.abort("r3") is True and eng.abort("r3") is False
    res = run_all(eng)  # type: ignore[arg-type]
    assert sorted(res) == ["r0", "r1", "r2"] and all(len(c.token_ids) == 12 for c in res.values())
    model = eng._llm.t.model
    for i in range(3):
        c = res[f"r{i}"]
        assert len(c.logprobs) == 12 and c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        assert max(abs(a - b) for a, b in zip(reference_logprobs(model, ps[i], c.token_ids), c.logprobs)) < 1e-4
    eng.add("w", ps[0], 30, seed=1)
    for _ in range(5):
        eng.step()
    eng.load_weights(favour_token(eng._llm.t.state_dict(), 7))
    assert eng._llm.resets == 1 and eng.stats()["recomputed_requests"] == 1
    (c,) = run_all(eng).values()  # type: ignore[arg-type]
    assert c.request_id == "w" and len(c.token_ids) == 30 and c.token_ids[5:] == [7] * 25
    assert c.token_ids[:5] != [7] * 5 and min(c.logprobs[5:]) > -1e-3
    assert eng.has_work() is False
    eng.close()


# ---------------------------------------------------------------- the worker as a Ray actor

@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    from rollart.runtime.cluster import init_local_ray

    started = not ray.is_initialized()
    if started:  # loopback only, token auth on (as a run starts it)
        init_local_ray(2, object_store_memory=200_000_000)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def actor(local_ray):
    from rollart.runtime.inference_worker import InferenceWorkerActor

    a = InferenceWorkerActor.options(num_cpus=0).remote("Qwen3-tiny", seed=0, name="gen-0",
                                                        engine_kwargs={"stop_token_ids": []})
    assert local_ray.get(a.ping.remote(), timeout=120) == "gen-0"
    yield a
    local_ray.kill(a)


@pytest.mark.slow
def test_actor_runs_concurrent_generates_and_round_trips(actor, local_ray) -> None:
    p = prompts(2)
    refs = [actor.generate.remote(f"c{i}", p[i], 16, 1.0, i) for i in range(2)]
    a, b = local_ray.get(refs, timeout=60)
    assert (a.request_id, len(a.token_ids), b.request_id, len(b.token_ids)) == ("c0", 16, "c1", 16)
    latencies = []
    for i in range(12):
        t0 = time.perf_counter()
        c = local_ray.get(actor.generate.remote(f"rt{i}", p[0], 8, 1.0, i), timeout=30)
        latencies.append(time.perf_counter() - t0)
        assert len(c.token_ids) == 8
    print(f"\nRay generate round trip, 8 new tokens: median {statistics.median(latencies[2:]) * 1e3:.1f} ms")


@pytest.mark.slow
def test_actor_orders_add_abort_suspend_resume_and_updates_weights(actor, local_ray) -> None:
    p = prompts(3)
    local_ray.get(actor.suspend.remote())
    waiting = actor.generate.remote("s1", p[0], 6, 1.0, 1)
    doomed = actor.generate.remote("s2", p[1], 6, 1.0, 2)
    ready, _ = local_ray.wait([waiting, doomed], timeout=0.5)
    assert ready == []                                   # suspended: nothing steps
    assert local_ray.get(actor.abort.remote("s2")) is True
    assert local_ray.get(doomed, timeout=10).finish_reason == "abort"
    local_ray.get(actor.resume.remote())
    assert len(local_ray.get(waiting, timeout=30).token_ids) == 6
    # a weight update mid-generation, through an object ref: later tokens follow the new weights
    v0 = local_ray.get(actor.version.remote())
    long = actor.generate.remote("u", p[2], 300, 1.0, 3)
    deadline = time.monotonic() + 20
    while local_ray.get(actor.stats.remote()).get("engine_stats", {}).get("running", 0) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    local_ray.get(actor.suspend.remote())
    state = favour_token(TorchEngine("Qwen3-tiny", None, seed=0, max_model_len=4096).state_dict(), 9)
    assert local_ray.get(actor.update_weights.remote(v0 + 1, local_ray.put(state)), timeout=30) == v0 + 1
    local_ray.get(actor.resume.remote())
    c = local_ray.get(long, timeout=60)
    assert len(c.token_ids) == 300 and c.token_ids[-5:] == [9] * 5
    first_new = next(i for i in range(300) if c.token_ids[i:] == [9] * (300 - i))
    assert 0 < first_new < 300
    s = local_ray.get(actor.stats.remote())
    assert s["version"] == v0 + 1 and s["engine_stats"]["recomputed_requests"] >= 1
