"""Where a model's parts go on one GPU: the one placement algorithm, used by `guild optimize` (pass 2, the plan's
placement section) and by the engine (guild.engine.gpu, from that section or, without a plan, from the VRAM free
now).

The units are what the engine runs on one backend: a whole layer (attention or Gated-DeltaNet weights, norms,
router, dense or shared FFN, and its state: the KV cache at the context, or a recurrent layer's snapshot pool
and conv history), then the output head (final norm and LM head) with the file's MTP blocks, then the token
embeddings (a row lookup, cheap on the CPU). Routed experts always stay on the CPU (their union per window is
the CPU's job). Layers fill the budget in order and stop at the first that does not fit ([0, gpu_layers) on
the GPU, so the residual rows cross once); the output goes only when every layer did, the embeddings only
when the output did. The budget is VRAM_SHARE of the VRAM less VRAM_RESERVE, kept for the CUDA context, the
memory pool's slack and the activations.

A plan records the result per group of tensors (guild.plan.Placement); `from_plan` reads back exactly the split
the plan was made from (tests/gpu/test_gpu_host.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import GuildError
from ..kvtypes import F32_KV, KVTypes
from ..plans.plan import GpuInfo, Placement, PlacementGroup, group_of

VRAM_SHARE = 0.90
VRAM_RESERVE = 256 * 2**20

# the plan's groups, in the order it lists them; the per-layer ones are what a layer unit holds
_ORDER = ("attention", "recurrent", "kv_cache", "norms", "router", "dense_ffn", "shared_experts", "mtp", "output",
          "embeddings", "other", "routed_experts")


def vram_budget(vram_bytes: int) -> int:
    """Bytes the placement may fill on a GPU with vram_bytes (the card's, for a plan; free now, for the engine)."""
    return max(0, int(vram_bytes * VRAM_SHARE) - VRAM_RESERVE)


@dataclass(frozen=True)
class GpuSplit:
    """What runs on the GPU: layers [0, gpu_layers) (attention, norms, router, dense FFN, their KV cache), the
    embedding table and the output matrix. Routed experts always stay on the CPU.

    From a plan's placement section (a mapping): `gpu_layers` (int), `embed` and `output` ("gpu" | "cpu")."""

    gpu_layers: int
    embed_gpu: bool = True
    output_gpu: bool = True

    @classmethod
    def from_section(cls, sec: Mapping, n_layers: int) -> GpuSplit:
        try:
            n = int(sec.get("gpu_layers", n_layers))
            emb, out = (str(sec.get(k, "gpu")).lower() for k in ("embed", "output"))
        except (TypeError, ValueError) as e:
            raise GuildError(f"plan placement section: {e}") from None
        if not 0 <= n <= n_layers or emb not in ("gpu", "cpu") or out not in ("gpu", "cpu"):
            raise GuildError(f"plan placement section invalid for a {n_layers}-layer model: {dict(sec)}")
        return cls(n, emb == "gpu", out == "gpu")

    def as_section(self) -> dict:
        return {"gpu_layers": self.gpu_layers, "embed": "gpu" if self.embed_gpu else "cpu",
                "output": "gpu" if self.output_gpu else "cpu"}

    @property
    def uses_gpu(self) -> bool:
        return self.gpu_layers > 0 or self.embed_gpu or self.output_gpu


@dataclass
class Parts:
    """A model's bytes per (group, layer): its tensors (GGUF names, llama.cpp grouping) and each layer's state
    under "kv_cache". Tensors of blocks past the trunk (MTP) are the "mtp" group; with a tied output the
    embedding matrix is the output's."""

    n_layers: int
    tied: bool
    embed: int = 0  # the token embedding matrix (with a tied output, also counted in "output")
    table: dict = field(default_factory=dict)  # (group, layer) -> [bytes, tensors]; layer -1: global

    @classmethod
    def from_table(cls, tensors: Iterable[tuple[str, int]], state_bytes: Mapping[int, int], n_layers: int) -> Parts:
        tensors = list(tensors)
        p = cls(n_layers, tied=not any(name == "output.weight" for name, _ in tensors))
        for name, nbytes in tensors:
            grp, lay = group_of(name)
            if lay >= n_layers and grp != "routed_experts":
                grp = "mtp"
            elif grp == "embeddings":
                p.embed += int(nbytes)
                grp = "output" if p.tied else grp
            s = p.table.setdefault((grp, lay), [0, 0])
            s[0] += int(nbytes)
            s[1] += 1
        for lay, nb in state_bytes.items():
            p.table.setdefault(("kv_cache", lay), [0, 0])[0] += int(nb)
        return p

    @classmethod
    def of_model(cls, model, n_ctx: int, kv: KVTypes = F32_KV) -> Parts:
        """A loaded model's parts with its state at a context of n_ctx tokens and KV types kv (as its
        architecture declares it: Architecture.state_bytes)."""
        tensors = [(t.name, int(t.data.nbytes)) for t in model.gguf.tensors.values()]
        return cls.from_table(tensors, dict(enumerate(model.state_bytes(n_ctx, kv))), model.args.n_layers)

    def bytes(self, grp: str, lay: int) -> int:
        return self.table.get((grp, lay), (0, 0))[0]

    def layer(self, i: int) -> int:
        """Layer i's unit: everything of the layer but its routed experts."""
        return sum(b for (g, lay), (b, _) in self.table.items() if lay == i and g != "routed_experts")

    @property
    def output(self) -> int:  # the output head (final norm, LM head: the embedding matrix when tied)
        return sum(b for (g, lay), (b, _) in self.table.items() if g == "output")

    @property
    def mtp(self) -> int:  # the file's MTP blocks but their routed experts: placed with the output head
        return sum(b for (g, lay), (b, _) in self.table.items() if g == "mtp")

    def on_gpu(self, split: GpuSplit, grp: str, lay: int) -> bool:
        if grp == "routed_experts":
            return False
        if 0 <= lay < self.n_layers:
            return lay < split.gpu_layers
        if grp in ("output", "mtp"):
            return split.output_gpu
        return grp == "embeddings" and split.embed_gpu


def split(parts: Parts, budget: int) -> GpuSplit:
    """The placement: layers in order while they fit, then the output head with the MTP blocks, then the
    embeddings (see the module docstring)."""
    n = 0
    for i in range(parts.n_layers):
        b = parts.layer(i)
        if b > budget:
            break
        budget -= b
        n += 1
    out = n == parts.n_layers and parts.output + parts.mtp <= budget
    if out:
        budget -= parts.output + parts.mtp
    emb = out and (parts.tied or parts.embed <= budget)
    return GpuSplit(n, emb, out)


def plan_placement(parts: Parts, gpu: GpuInfo | None, context: int) -> Placement:
    """Pass 2 of `guild optimize`: the split for this GPU's VRAM, per group (none without a GPU)."""
    budget = 0 if gpu is None else vram_budget(gpu.vram_bytes)
    sp = split(parts, budget) if gpu is not None else GpuSplit(0, False, False)
    groups = []
    for g in _ORDER:
        keys = [k for k in parts.table if k[0] == g]
        if not keys:
            continue
        total = sum(parts.table[k][0] for k in keys)
        gb = sum(parts.table[k][0] for k in keys if parts.on_gpu(sp, *k))
        device = "cpu" if gb == 0 else "gpu" if gb == total else "split"
        groups.append(PlacementGroup(g, device, sum(parts.table[k][1] for k in keys), total, gb))
    if gpu is None:
        note = "no GPU: everything runs on the CPU"
    else:
        spl = [g.name for g in groups if g.device == "split"]
        cpu = [g.name for g in groups if g.device == "cpu" and g.name != "routed_experts"]
        note = f"routed experts on the CPU; {gpu.name} holds the rest that fits the budget" + (
            f" (split: {', '.join(spl)}; CPU: {', '.join(cpu)})" if spl or cpu else "")
    return Placement(gpu.name if gpu else None, budget, context, tuple(groups), note)


def from_plan(pl: Placement, parts: Parts) -> GpuSplit:
    """The split a plan's placement section records: the longest prefix of layers whose every per-layer group
    fits in that group's GPU bytes (a plan made by plan_placement at the same context gives back its split;
    any other never puts more on the GPU than the plan budgeted), the output and embeddings as their groups."""
    groups = {x.name: x for x in pl.groups}
    n = parts.n_layers if pl.gpu else 0
    for name in {g for g, lay in parts.table if 0 <= lay < parts.n_layers and g != "routed_experts"}:
        grp = groups.get(name)
        if grp is None or grp.device == "gpu":
            continue
        used = k = 0
        while k < parts.n_layers and used + parts.bytes(name, k) <= grp.gpu_bytes:
            used += parts.bytes(name, k)
            k += 1
        n = min(n, 0 if grp.device == "cpu" else k)

    def on(name: str) -> bool:
        grp = groups.get(name)
        return grp is not None and grp.device == "gpu"

    out = on("output")
    return GpuSplit(n, on("embeddings") or (parts.tied and out), out)


# -- on a loaded model ---------------------------------------------------------------------------------------
def placement_for(model, gpu: GpuInfo | None, context: int, kv: KVTypes = F32_KV) -> Placement:
    """Pass 2 of `guild optimize` for a loaded model."""
    return plan_placement(Parts.of_model(model, context, kv), gpu, context)


def default_placement(model, free_bytes: int, n_ctx: int, kv: KVTypes = F32_KV) -> GpuSplit:
    """The engine's placement without a plan: the split for the VRAM free now."""
    return split(Parts.of_model(model, n_ctx, kv), vram_budget(free_bytes))


def placement_from_plan(pl: Placement, model, n_ctx: int, kv: KVTypes = F32_KV) -> GpuSplit:
    return from_plan(pl, Parts.of_model(model, n_ctx, kv))


def spill_report(model, sp: GpuSplit, n_ctx: int, kv: KVTypes = F32_KV) -> str:
    """What a placement leaves on the CPU besides the routed experts, in words (empty when nothing spilled)."""
    p, n = Parts.of_model(model, n_ctx, kv), model.args.n_layers
    cpu = []
    if sp.gpu_layers < n:
        nb = sum(p.layer(i) for i in range(sp.gpu_layers, n))
        cpu.append(f"layers {sp.gpu_layers}..{n - 1} ({nb / 2**20:.1f} MiB)")
    if not sp.output_gpu:
        cpu.append(f"output head ({p.output / 2**20:.1f} MiB)" + (" and MTP head" if p.mtp else ""))
    if not sp.embed_gpu:
        cpu.append(f"embeddings ({p.embed / 2**20:.1f} MiB)")
    return "spilled to the CPU: " + ", ".join(cpu) if cpu else ""
