"""Mixture-of-experts weight traffic: how many experts a batch of tokens touches.

Each token is routed to ``active`` of ``experts`` experts. With the router's choices taken as
independent and uniform, an expert escapes all ``B`` tokens of a step with probability
``(1 − k/E)^B``, so the step reads the weights of

    E_touched(B) = E · (1 − (1 − k/E)^B)

experts on average: ``k`` for one token, rising monotonically towards ``E`` as the batch grows.
Decode at a realistic batch is therefore much closer to reading the whole model than to reading
only one token's active experts. Both the roofline (``sim.costs.gpu``) and the calibrated
kernel-profile cost (``calibration.cost``) use these helpers, so the two agree.
A dense model is the case ``E = k = 1``. Only the routed experts of the MoE layers count as
experts here: a DeepSeek-V3-like model's dense first layers (``dense_layers``) and shared experts
(``shared_expert_intermediate``) run for every token, so every step reads them whole, with the attention.
"""

from __future__ import annotations

import math
from functools import lru_cache

from rollart.plan.schema import GpuType, ModelSpec


def experts_touched(tokens: float, experts: int, active: int) -> float:
    """Expected distinct experts read by a step over ``tokens`` tokens with top-``active`` routing
    among ``experts``: ``E·(1 − (1 − k/E)^B)``, within [min(k, E), E]; 0 for no tokens."""
    if tokens <= 0:
        return 0.0
    experts = max(1, experts)
    active = min(max(1, active), experts)
    if active == experts:
        return float(experts)
    # 1 − (1 − k/E)^B without cancellation when k/E is small
    touched = -experts * math.expm1(tokens * math.log1p(-active / experts))
    return min(float(experts), max(float(active), touched))


def model_experts_touched(model: ModelSpec, tokens: float) -> float:
    """:func:`experts_touched` for ``model`` (1 for a dense model)."""
    if not model.moe_experts:
        return 1.0 if tokens > 0 else 0.0
    return experts_touched(tokens, model.moe_experts, model.moe_active_experts)


def expert_params(model: ModelSpec) -> int:
    """Parameters of all the routed experts' MLPs over the MoE layers (0 for a dense model: its MLP is
    not an expert; a shared expert and the dense first layers are not routed, so not here either)."""
    return model.moe_layers * 3 * model.hidden * model.intermediate * model.moe_experts


DTYPE_BYTES = {"bf16": 2, "fp8": 1}


def weight_element_bytes(model: ModelSpec) -> int:
    """Bytes per linear-layer weight as the engines serve it (``model.weight_dtype``)."""
    return DTYPE_BYTES[model.weight_dtype]


def embedding_params(model: ModelSpec) -> int:
    """Embedding and lm_head parameters: kept in BF16 when the linear layers are FP8."""
    return model.vocab * model.hidden * (1 if model.tied_embeddings else 2)


def input_embedding_params(model: ModelSpec) -> int:
    """Parameters only the input embedding uses: a row lookup, no matmul and a few rows read per
    token. With tied embeddings the one matrix is also the lm_head, a GEMM that counts: 0 here."""
    return 0 if model.tied_embeddings else model.vocab * model.hidden


def served_weight_bytes(model: ModelSpec) -> float:
    """Weight bytes an engine holds: the linear layers in ``weight_dtype``, embeddings in BF16.
    Equals ``model.weight_bytes`` (BF16, the trainer's copy) when the engines serve BF16."""
    emb = embedding_params(model)
    return 2.0 * emb + weight_element_bytes(model) * float(model.params - emb)


def weight_bytes_read(model: ModelSpec, tokens: float) -> float:
    """Weight bytes one forward step over ``tokens`` tokens reads: every non-expert weight (attention,
    a shared expert, the dense first layers) plus the routed experts the batch touches, each in the
    served dtype. Equals ``served_weight_bytes`` for a dense
    model (``model.weight_bytes`` in BF16)."""
    if not model.moe_experts:
        return served_weight_bytes(model)
    b = weight_element_bytes(model)
    per_expert = b * expert_params(model) / model.moe_experts
    dense = served_weight_bytes(model) - b * expert_params(model)
    return dense + per_expert * model_experts_touched(model, max(1.0, tokens))


# ---------------------------------------------------------------- expert parallelism
#
# A worker of ``tp`` GPUs with ``ep`` expert-parallel ranks (DP attention + EP MoE, as SGLang and
# vLLM serve MoE models): each rank of tp/ep GPUs runs attention and the dense layers for its
# share (1/ep) of the sequences, holds E/ep of the experts, and exchanges every token's hidden
# state with the ranks of its k experts (dispatch) and back (combine) in each MoE layer. ep = 1
# is plain tensor parallelism. The step waits for the busiest rank.

# GPUs that share one NVLink domain when a caller names no GPU type: GpuType.nvlink_domain's default (an HGX
# board of 8). The GPU type's own field is the one source; a cost model with a GpuType passes its domain.
DEFAULT_NVLINK_DOMAIN: int = GpuType.model_fields["nvlink_domain"].default


def domain_name(domain: int) -> str:
    """What a cost model's source calls one NVLink domain of ``domain`` GPUs: a node for an HGX board (the
    default, as the reports always said), else the domain with its size (a 72-GPU NVL72 rack)."""
    return "node" if domain == DEFAULT_NVLINK_DOMAIN else f"{domain}-GPU NVLink domain"


def effective_domain(group: int, total: int, domain: int = DEFAULT_NVLINK_DOMAIN) -> int:
    """The NVLink domain size a cost should price a ``group``-GPU collective with, for the worst of the
    ``total // group`` groups laid out as consecutive GPUs from a domain boundary (GPUs 0…group−1,
    group…2·group−1, …: the trainer's tp and ep groups over its GPUs, a generation group's workers of tp
    GPUs each), in NVLink domains of ``domain`` GPUs (GPUs 0…domain−1, domain…2·domain−1, …).

    ``domain`` itself when no group is cut unevenly by a domain boundary: the groups fit one domain
    (``total ≤ domain``), tile it (``domain % group == 0``) or are whole domains (``group % domain == 0``).
    Else the fewest of a cut group's GPUs that share one domain: over the domain boundaries b = k·domain
    inside the groups' span with r = b mod group ≠ 0, ``min(domain, r, group − r)`` (a group wider than a
    domain also has whole domains in its middle, never smaller). With it ``ring_link(group, …,
    domain=eff)`` crosses the network (eff < group), and ``all_to_all_s``'s off-domain share
    ``(ep − ranks_per_domain) / (ep − 1)`` is that of a rank in the smallest piece, the worst group's
    worst rank; the step waits for it. 72-GPU domains: a group of 16 on 144 GPUs (GPUs 64–79: 8 on each
    side) → 8; 64 on 128 (GPUs 64–127: 8 in the first rack) → 8; 32 on 64 → 72 (one rack). A group wider
    than a domain and cut unevenly (64 on 128 GPUs of 36) gets its smallest piece too (8: GPUs 64–71),
    where ``domain`` alone would give each rank a whole domain of peers. Cost: one pass over the
    ``total / group`` groups (:func:`worker_domain` of each)."""
    if total <= domain or domain % group == 0 or group % domain == 0:
        return domain
    return min((worker_domain(i * group, group, domain) for i in range(total // group)), default=domain)


def worker_domain(start: int, group: int, domain: int = DEFAULT_NVLINK_DOMAIN) -> int:
    """:func:`effective_domain` of the one group on GPUs ``start`` … ``start + group − 1`` (a generation
    worker, ``start`` its index × tp): ``domain`` unless a domain boundary cuts it unevenly, else its
    smallest piece on one side of a boundary. The minimum over a layout's groups is
    :func:`effective_domain`. 72-GPU racks: the third tp-32 worker (GPUs 64–95) → 8, the others → 72."""
    piece = domain
    for b in range((start // domain + 1) * domain, start + group, domain):
        piece = min(piece, b - start, start + group - b)
    return piece


def straddle_note(group: int, domain: int, effective: int) -> str:
    """What a cost model's source adds when its ``group``-GPU worker straddles NVLink domains of ``domain``
    GPUs (``effective`` < ``domain``, from :func:`worker_domain`); nothing otherwise."""
    if effective >= domain:
        return ""
    return (f"; a tp-{group} worker straddling {domain_name(domain)}s (as few as {effective} of its GPUs on one "
            "side): its collectives priced across the network")


def busiest_rank_sequences(batch: float, ep: int) -> float:
    """Sequences the busiest of ``ep`` data-parallel attention ranks holds for a decode batch of
    ``batch``: a sequence lives on one rank, so ⌈batch/ep⌉ (one sequence alone is all on one rank)."""
    return float(math.ceil(batch / ep)) if ep > 1 and batch > 0 else float(batch)


def busiest_rank_share(count: float, ep: int) -> float:
    """The busiest rank's share of ``count`` whole sequences (or prompts) over an even 1/ep: it holds
    ⌈count/ep⌉ of them, so 1 when ep divides count, ep for one alone; 1 for ep = 1 or no count."""
    return ep * busiest_rank_sequences(count, ep) / count if ep > 1 and count > 0 else 1.0


def _busiest(mean: float, var: float, ep: int) -> float:
    """Expected maximum over ``ep`` ranks of a count with this mean and variance (Gaussian
    extreme: mean + σ·√(2 ln ep)); the mean itself for one rank."""
    return mean if ep <= 1 else mean + math.sqrt(max(0.0, var) * 2.0 * math.log(ep))


def rank_experts_touched(model: ModelSpec, tokens: float, ep: int) -> float:
    """Distinct experts the busiest of ``ep`` ranks reads in a step over ``tokens`` tokens: each of
    its E/ep experts is touched with probability q = E_t/E (binomial), so k·… for one token on
    average and all E/ep for a large batch. :func:`model_experts_touched` when ep = 1."""
    touched = model_experts_touched(model, tokens)
    if ep <= 1 or not model.moe_experts:
        return touched
    local = model.moe_experts / ep
    q = touched / model.moe_experts
    return min(local, _busiest(local * q, local * q * (1 - q), ep))


def rank_expert_rows(model: ModelSpec, tokens: float, ep: int) -> float:
    """Token-expert rows (tokens × k) the busiest of ``ep`` ranks computes; each row lands on a
    rank with probability 1/ep."""
    rows = tokens * max(1, model.moe_active_experts)
    if ep <= 1:
        return rows
    return min(rows, _busiest(rows / ep, rows * (1 / ep) * (1 - 1 / ep), ep))


def expert_weight_bytes(model: ModelSpec) -> float:
    """Bytes of all the experts' weights as served."""
    return weight_element_bytes(model) * float(expert_params(model))


def replicated_params(model: ModelSpec) -> int:
    """Parameters every tensor-parallel GPU holds whole: MLA's down-projections q_a (hidden →
    q_lora_rank) and kv_a (hidden → kv_lora_rank + rope), which vLLM and SGLang do not split (their
    outputs are the latent every GPU's heads need); 0 for standard attention."""
    if not model.mla:
        return 0
    return model.layers * model.hidden * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)


def worker_weight_bytes(model: ModelSpec, ep: int = 1, tp: int = 1) -> float:
    """Weight bytes a worker of ``tp`` GPUs holds over all of them: with ep ranks the non-expert weights
    are replicated on every rank, the experts split among them; each of a rank's tp/ep GPUs also holds
    its own copy of :func:`replicated_params` (MLA; ``tp`` only matters there)."""
    served = served_weight_bytes(model)
    held = served + (max(1, ep) - 1) * (served - expert_weight_bytes(model))
    if model.mla:
        held += max(0, tp - max(1, ep)) * weight_element_bytes(model) * float(replicated_params(model))
    return held


def gpu_weight_bytes(model: ModelSpec, ep: int = 1, tp: int = 1) -> float:
    """Weight bytes one GPU of a worker of ``tp`` GPUs in ``ep`` ranks holds, and so loads when the worker
    takes new weights from host memory: its share of :func:`worker_weight_bytes`."""
    return worker_weight_bytes(model, ep, tp) / tp


def ring_link(gpus: int, nvlink: tuple[float, float], network: tuple[float, float],
              domain: int = DEFAULT_NVLINK_DOMAIN, ports: int | None = None) -> tuple[float, float]:
    """(bytes/s, latency s) that pace a ring collective (a tensor-parallel all-reduce) over ``gpus``
    GPUs: NVLink within one NVLink domain of ``domain`` GPUs (the GPU type's ``nvlink_domain``: an HGX
    node of 8, an NVL72 rack of 72); a ring wider than a domain crosses the cluster's network at every
    domain boundary. ``network`` is one GPU's own port (HGX nodes carry a NIC per GPU) and NCCL runs a
    channel per NIC, so a ring with ``ports`` members in each domain (default min(gpus, domain): a
    contiguous group) crosses at ports × the port's rate, capped by the NVLink hops inside the domain:
    min(NVLink, ports × network) (nccl-tests across DGX nodes: ~48 GB/s with 4 IB adapters, 85–96 GB/s
    with 4 × 200 Gb/s; one data-parallel ring a GPU of each node, ports 1, gets one NIC). A caller whose
    groups are laid out over more GPUs than one domain passes :func:`effective_domain`, so a ring that
    straddles a boundary crosses too, with its smallest piece's ports.

    The latency is one collective call's (callers pay it once a call: α + bytes / rate): NVLink's α plus
    the network's, never the larger alone."""
    if gpus <= domain:
        return nvlink
    k = max(1, min(gpus, domain) if ports is None else ports)
    # NVLink's α is a whole all-reduce's inside a domain (~30 µs), the network's one message across it (~20 µs).
    # A crossing ring still makes its NVLink hops and adds network hops on the same dependent chain (NCCL's
    # tuning model sums intra-node steps at the NVLink latency and inter-node steps at the network's), so the
    # two add; max() let the slower NVLink α hide the network. One network α a call is a floor (NCCL: 2(n − 1)
    # network steps on a ring over n domains, 2·log2 n on a tree). A ring of one member a domain (ports 1) makes
    # no NVLink hop and is charged NVLink's α too: ~20 µs a call over, kept so that a wider domain never prices
    # a ring slower (with domain 1 every hop is the network's, α the network's alone).
    return min(nvlink[0], k * network[0]), nvlink[1] + network[1]


# DeepEP's dispatch of an FP8-served MoE sends each hidden element as FP8 plus an FP32 scale per 128 of
# them (its low-latency and normal kernels alike); the combine returns BF16. A BF16 model, and training,
# move BF16 both ways.
FP8_DISPATCH_BYTES = 1 + 4 / 128


def dispatch_bytes(model: ModelSpec) -> float:
    """Bytes an element of a token's hidden state takes on the wire in a serving engine's dispatch."""
    return FP8_DISPATCH_BYTES if model.weight_dtype == "fp8" else 2.0


@lru_cache(maxsize=256)  # a few (E, k, groups) per run, asked at every prefilling engine step
def groups_reached(experts: int, active: int, groups: int) -> float:
    """Expected distinct groups a token's ``active`` experts fall in when ``experts`` experts are split
    evenly into ``groups`` groups (ranks, or NVLink domains of ranks) and a token picks its experts
    uniformly without replacement: ``groups · (1 − Π_{i<k} (E − E/g − i)/(E − i))``; 1 for one group."""
    if groups <= 1:
        return 1.0
    experts = max(1, experts)
    active = min(max(1, active), experts)
    outside = experts - experts / groups
    miss = 1.0
    for i in range(active):
        miss *= max(0.0, outside - i) / (experts - i)
    return groups * (1.0 - miss)


def all_to_all_s(model: ModelSpec, tokens: float, ep: int, tp: int, nvlink_bytes_per_s: float, nvlink_latency_s: float,
                 net_bytes_per_s: float, net_latency_s: float, rank_tokens: float | None = None,
                 domain: int = DEFAULT_NVLINK_DOMAIN, dispatch: float = 2.0, kernel: str = "low_latency",
                 rdma: bool = True) -> float:
    """Dispatch + combine of every MoE layer (``model.moe_layers``: not the dense first layers) for a
    step over ``tokens`` tokens on a worker of ``tp`` GPUs in ``ep`` ranks: each token's hidden state goes to its k experts' ranks and
    back; the (ep−1)/ep that leave the rank are spread over its tp/ep GPUs. Within one NVLink domain
    of ``domain`` GPUs (the GPU type's ``nvlink_domain``) it moves over NVLink; a worker wider than a
    domain sends the off-domain share over the cluster's network (``net``), and the slower path sets
    the time (the two paths run in parallel). A caller whose groups straddle domain boundaries passes
    :func:`effective_domain` (the worst group's smallest piece on one side) or, for one worker,
    :func:`worker_domain`. ``rank_tokens``: the busiest rank's tokens when they are not an even
    ``tokens / ep`` (a prompt prefills on one rank, so a step of fewer prompts than ranks sends all of a
    prompt's tokens from one); it sends them all, and the step waits for it. ``dispatch``: bytes an element
    takes going out (:func:`dispatch_bytes` for a serving engine; BF16's 2 for training); the combine
    returns BF16. 0 when ep = 1.

    ``kernel`` says how many copies of a token travel, as DeepEP's two kernel families send them:
    ``"low_latency"`` (decode, and training's all-to-all dispatcher) sends one per routed expert
    outside the rank, k·(ep−1)/ep; ``"normal"`` (DeepEP's high-throughput kernels, which serving
    engines run for steps that prefill) sends a token once to each destination rank over NVLink,
    D_rank·(1 − 1/ep) copies, and once to each other NVLink domain over the network, whose receiving
    GPU forwards it on over NVLink: D_dom·(1 − 1/n_dom) copies (:func:`groups_reached`; the own rank's
    and own domain's expected share removed by symmetry). DeepSeek-V3 on EP32 over 4 nodes, routing
    uniform: 2.7 network copies a token expected, against 6 for the low-latency layout.

    ``rdma`` False (a TCP network): DeepEP's kernels need RDMA between nodes, so a worker wider than a
    domain runs the engine's fallback (vLLM's default all2all backend), an all-gather of every rank's
    tokens to every rank and a reduce-scatter back, both in BF16: (ep−1)/ep of the step's tokens reach each
    GPU, in a ring whose network hops cross at min(NVLink, ports × port) (:func:`ring_link`)."""
    if ep <= 1 or not model.moe_experts:
        return 0.0
    k = max(1, model.moe_active_experts)
    rank_tp = tp // ep
    sent = tokens / ep if rank_tokens is None else rank_tokens
    # of the ep − 1 ranks a token may leave for, those outside this NVLink domain (a rank wider than a
    # domain has none beside it)
    ranks_per_domain = max(1, domain // rank_tp)
    off_domain = (ep - min(ep, ranks_per_domain)) / (ep - 1)

    if not rdma and ranks_per_domain < ep:
        rate, _ = ring_link(ep, (nvlink_bytes_per_s, nvlink_latency_s), (net_bytes_per_s, net_latency_s),
                            ranks_per_domain)
        # priced step by step (ep − 1 steps each way), not a call at a time as ring_link's latency is: each
        # step has some hop crossing the network and waits for the slowest hop
        step = max(nvlink_latency_s, net_latency_s)
        gathered = tokens * model.hidden * 2.0 * (ep - 1) / ep  # every other rank's tokens, BF16
        return model.moe_layers * 2 * ((ep - 1) * step + gathered / rate)
    if kernel == "low_latency":
        def one_way(element_bytes: float) -> float:
            per_gpu = sent * k * model.hidden * element_bytes * (ep - 1) / ep / rank_tp
            t = nvlink_latency_s + per_gpu * (1 - off_domain) / nvlink_bytes_per_s
            if off_domain:
                t = max(t, net_latency_s + per_gpu * off_domain / net_bytes_per_s)
            return t
    elif kernel == "normal":
        domains = math.ceil(ep / min(ep, ranks_per_domain))
        # a rank as wide as a domain has no rank beside it to forward to
        nvlink_copies = groups_reached(model.moe_experts, k, ep) * (1 - 1 / ep) if ranks_per_domain > 1 else 0.0
        net_copies = groups_reached(model.moe_experts, k, domains) * (1 - 1 / domains) if domains > 1 else 0.0

        def one_way(element_bytes: float) -> float:
            per_copy = sent * model.hidden * element_bytes / rank_tp  # a GPU's share of one copy of its tokens
            t = nvlink_latency_s + per_copy * nvlink_copies / nvlink_bytes_per_s
            if net_copies:
                t = max(t, net_latency_s + per_copy * net_copies / net_bytes_per_s)
            return t
    else:
        raise ValueError(f"kernel must be 'low_latency' or 'normal', not {kernel!r}")

    return model.moe_layers * (one_way(dispatch) + one_way(2.0))


def rank_collectives_s(model: ModelSpec, tokens: float, ep: int, tp: int, nvlink: tuple[float, float],
                       network: tuple[float, float], domain: int, rdma: bool, kernel: str = "low_latency",
                       rank_tokens: float | None = None,
                       custom: tuple[float, float, float] | None = None) -> float:
    """A serving step's communication on a worker of ``tp`` GPUs in ``ep`` ranks: the MoE all-to-alls
    between ranks (:func:`all_to_all_s`, ``kernel`` as there) plus the two all-reduces per layer inside a
    rank of tp/ep GPUs, for the busiest rank's ``rank_tokens`` (an even ``tokens / ep`` when not given).
    An all-reduce is a ring over :func:`ring_link` (NCCL: latency + 2(n−1)/n of the BF16 activations at
    the link's rate). ``custom`` (latency s, bytes/s, largest message) is the engine's peer-to-peer
    kernel where its world size has one: it takes messages below its largest, and an engine picks the
    faster path, so it is never priced above NCCL. It needs its GPUs' peer-to-peer access, so a rank that
    straddles a domain boundary (``domain`` < its GPUs) runs NCCL."""
    rank_tokens = tokens / ep if rank_tokens is None else rank_tokens
    comm = all_to_all_s(model, tokens, ep, tp, *nvlink, *network, rank_tokens=rank_tokens, domain=domain,
                        dispatch=dispatch_bytes(model), kernel=kernel, rdma=rdma)
    n = tp // ep
    if n == 1:
        return comm
    nbytes = rank_tokens * model.hidden * 2.0
    moved = 2 * (n - 1) / n * nbytes
    rate, alpha = ring_link(n, nvlink, network, domain)
    each = alpha + moved / rate
    if custom is not None and nbytes < custom[2] and n <= domain:  # peer-to-peer: all its GPUs on one NVLink domain
        each = min(each, custom[0] + moved / custom[1])
    return comm + 2 * model.layers * each
