"""Pass 2 of `guild optimize`: which tensors go to the GPU, from tensor sizes and the KV cache for `--context`.

Routed experts always stay on the CPU (their union per window is the CPU's job). With a GPU the
per-token hot path goes first, layer by layer (attention or recurrent weights with that layer's KV cache, its
norms and router), then each layer's dense/shared FFN and MTP head, then the output head, then the token
embeddings (a row lookup, cheap on the CPU); a unit that does not fit the VRAM budget stays on the CPU and
smaller later units may still fit. Without a GPU everything is CPU and the plan says so.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..plans.plan import GpuInfo, Placement, PlacementGroup, group_of

# VRAM kept free for the CUDA context, cuBLAS workspaces and activations
VRAM_SHARE = 0.90
VRAM_RESERVE = 256 * 2**20
KV_BYTES = 4  # guild's KV cache is float32 (guild.engine.state.KVCache)

# placement priority: (group, per layer?) — the per-token hot path first
_HOT = ("attention", "recurrent", "kv_cache", "norms", "router")
_ORDER = ("attention", "recurrent", "kv_cache", "norms", "router", "dense_ffn", "shared_experts", "mtp", "output",
          "embeddings", "other", "routed_experts")


def vram_budget(gpu: GpuInfo | None) -> int:
    return 0 if gpu is None else max(0, int(gpu.vram_bytes * VRAM_SHARE) - VRAM_RESERVE)


def plan_placement(tensors: Iterable[tuple[str, int]], kv_bytes: dict[int, int], gpu: GpuInfo | None, context: int,
                   tied_output: bool = False) -> Placement:
    """tensors: (GGUF name, bytes); kv_bytes: KV cache bytes per layer at `context`. With `tied_output` the
    token embedding matrix is also the output head (placed with the output's priority)."""
    sizes: dict[tuple[str, int], list[int]] = {}  # (group, layer) -> [bytes, tensors]
    for name, nbytes in tensors:
        grp, layer = group_of(name)
        if grp == "embeddings" and tied_output:
            grp = "output"
        s = sizes.setdefault((grp, layer), [0, 0])
        s[0] += int(nbytes)
        s[1] += 1
    for layer, nb in kv_bytes.items():
        if nb:
            sizes.setdefault(("kv_cache", layer), [0, 0])[0] += int(nb)
    budget = vram_budget(gpu)
    on_gpu: set[tuple[str, int]] = set()
    if gpu is not None:
        used = 0
        layers = sorted({lay for _, lay in sizes if lay >= 0})
        units: list[list[tuple[str, int]]] = []
        for lay in layers:  # the hot path of each layer as one unit: a layer's attention needs its KV with it
            units.append([(g, lay) for g in _HOT if (g, lay) in sizes])
        for g in ("dense_ffn", "shared_experts", "mtp"):
            units += [[(g, lay)] for lay in layers if (g, lay) in sizes]
        units += [[(g, -1)] for g in ("output", "embeddings") if (g, -1) in sizes]
        for unit in units:
            nb = sum(sizes[k][0] for k in unit)
            if unit and used + nb <= budget:
                on_gpu.update(unit)
                used += nb
    groups = []
    for g in _ORDER:
        keys = [k for k in sizes if k[0] == g]
        if not keys:
            continue
        total = sum(sizes[k][0] for k in keys)
        gb = sum(sizes[k][0] for k in keys if k in on_gpu)
        device = "cpu" if gb == 0 else "gpu" if gb == total else "split"
        groups.append(PlacementGroup(g, device, sum(sizes[k][1] for k in keys), total, gb))
    if gpu is None:
        note = "no GPU: everything runs on the CPU"
    else:
        split = [g.name for g in groups if g.device == "split"]
        cpu = [g.name for g in groups if g.device == "cpu" and g.name != "routed_experts"]
        note = f"routed experts on the CPU; {gpu.name} holds the rest that fits the budget" + (
            f" (split: {', '.join(split)}; CPU: {', '.join(cpu)})" if split or cpu else "")
    return Placement(gpu.name if gpu else None, budget, context, tuple(groups), note)


def kv_bytes_per_layer(g, context: int) -> dict[int, int]:
    """KV cache bytes per layer at `context` tokens; layers without attention (recurrent ones) have none."""
    a = g.architecture
    n_layers = int(g.get(f"{a}.block_count", int))
    n_heads = int(g.get(f"{a}.attention.head_count", int))
    n_kv = int(g.get(f"{a}.attention.head_count_kv", int, n_heads))
    dim = int(g.get(f"{a}.embedding_length", int))
    k_len = int(g.get(f"{a}.attention.key_length", int, dim // n_heads))
    v_len = int(g.get(f"{a}.attention.value_length", int, k_len))
    ctx = min(context, int(g.get(f"{a}.context_length", int, context)))
    has_attn = [any(g.has(f"blk.{i}.{n}.weight") for n in ("attn_k", "attn_qkv")) for i in range(n_layers)]
    if not any(has_attn):
        has_attn = [True] * n_layers
    return {i: n_kv * (k_len + v_len) * ctx * KV_BYTES if has_attn[i] else 0 for i in range(n_layers)}


def placement_for(g, gpu: GpuInfo | None, context: int) -> Placement:
    """Pass 2 for an opened GGUFFile."""
    tensors = [(t.name, int(t.data.nbytes)) for t in g.tensors.values()]
    return plan_placement(tensors, kv_bytes_per_layer(g, context), gpu, context, tied_output=not g.has("output.weight"))
