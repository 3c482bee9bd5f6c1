"""The int8-activation path ("i8" numerics): integer dot products for every quant type it covers, one kernel per
type, batch-invariant.

Activations. Each row is quantised with one scale per 32 elements for the 32-element-block weight types and
per 256 for the super-block types (ggml's Q8_0 and Q8_K: d = max|x| / 127, q = rint(x * (1 / d)) in float32),
with each 32-block's Σq and the sums of its two halves (the 16-element sub-blocks of Q2_K, Q3_K, Q6_K).

Weights ("quad tiles"). Features in tiles of NT = 64, each tile in 4 groups of GL = 16 (a vector's lanes);
per 32-element block, the four bytes of consecutive k of one feature are adjacent, so one 64-byte load holds 16
features × 4 k: the operand of a 4-byte integer dot (`simd.dot4`: vpdpbusd on AVX-512 VNNI, vpmaddubsw +
vpmaddwd on AVX2). Every field is group-major ([tile, group, block, ..., lane]): a pass over one group's blocks
reads memory in order, which the hardware prefetchers stream at the memory's bandwidth (groups interleaved
within each block would make a pass read one cache line in four). Every type is repacked at load into nibble
quads (byte i of quad q: low nibble = element 4q + i, high nibble = element 16 + 4q + i) or 2-bit
quads, plus bit planes for the bits above (one 32-bit word per feature and block, laid out so that a shift and
a mask give the bits of one quad), integer sub-block scales as bytes, and the f16 scales of the block or
super-block; the grid types keep their grid indices, sign bits and scales (dots.py). The packed bytes per
weight stay those of the GGUF type within 3 % (Q3_K, IQ3_S, IQ1_M +3.6 %; IQ3_XXS +8 %, IQ2_XS +11 %, IQ2_XXS +12 %).

Arithmetic per output feature n of row t (x̂ the row's quantised block, dx its scale, s = Σx̂, s_A and s_B the
sums of its halves, a = Σ u·x̂ over the block's unsigned quants u, a_A, a_B over each half). The 32-element
types, per block b:
  Q4_0: y = fma(a − 8s, d·dx, y)             Q5_0: y = fma(a − 16s, d·dx, y)
  Q4_1, Q5_1: y = fma(a, d·dx, y); y = fma(m, dx·s, y)
  Q8_0: y = fma(Σ q·x̂, d·dx, y)
  IQ4_NL: y = fma(Σ v·x̂, d·dx, y)   MXFP4: y = fma(Σ v·x̂, 2^(e−128)·dx, y)
The super-block types sum integers i (and min terms m) over the 8 blocks of a super-block, then per super-block
(D, M its f16 scale and min scale, dx the super-block's activation scale): y = fma(Σ i, D·dx·c, y), and
y = fma(−Σ m, M·dx, y) for Q4_K, Q5_K, Q2_K; per block:
  Q4_K, Q5_K: i = sc·a, m = mn·s     Q2_K: i = sc_A·a_A + sc_B·a_B, m = mn_A·s_A + mn_B·s_B
  Q6_K: i = sc_A·(a_A − 32 s_A) + sc_B·(a_B − 32 s_B)      Q3_K: i = sc_A·(a_A − 4 s_A) + sc_B·(a_B − 4 s_B)
  IQ4_XS: i = (ls − 32)·Σ v·x̂   (v: the signed level a nibble indexes, looked up 64 bytes at a time with vpshufb)
  IQ2_XXS, IQ3_XXS, IQ3_S: i = sc·(a_A + a_B)   IQ2_XS, IQ2_S: i = sc_A·a_A + sc_B·a_B
  (a: Σ |g|·(±x̂), the grid's magnitudes g read by index, the sign bits applied to x̂; sc = 2s + 1 and c = 1/8
  for ggml's (0.5 + s)·0.25, 1/4 for IQ3_XXS's (0.5 + s)·0.5; IQ3_S: sc = 1 + 2s, c = 1; a single row of
  IQ2_XXS or IQ3_XXS sums each feature's block with its elements in lanes, where a row's grid entries load
  into place instead of being gathered lane by lane for 16 features: the same integers, 1.2–1.6× faster)
  IQ1_S: i = sc·(8 Σ g·x̂ + σ s), c = 1/8   (g ∈ {−1, 0, 1}, ggml's delta ±1/8 = σ/8)
  IQ1_M: i = Σ_halves sc_h·(8 Σ g·x̂ + Σ_l σ_l s_l), c = 1/8   (σ_l, s_l per group of 8)
(integer sums exact in int32, each converted to f32 once; each product of f32 scales rounded once). The float
chain is fixed per (row, feature), whichever path computes it and however many rows or threads there are:
every output row is bitwise the same alone, in a window, in a batch or in a prefill chunk (Thinking Machines,
"Defeating Nondeterminism in LLM Inference", 2025: a fixed reduction order per output element).
Twin: kernels/ref_quant.py `quantize_act_q8`, `matmul_ref(act=...)`.
Modules: types.py (geometry, the per-type fields), packers.py (GGUF blocks → fields, compiled), pack.py (its NumPy
twin, and get_rows), activations.py, dots.py (the block arithmetic), tiles.py (the same integers on AMX tiles, 16
rows at a time: Q2_K to Q6_K, IQ4_XS, Q8_0), kernels.py (the C entry points).
"""

from .activations import ACT_EXTRA, act_bytes, act_group, quantize_acts, quantize_groups
from .kernels import KERNELS
from .pack import get_rows, pack_numpy
from .packers import KINDS as PACKERS
from .packers import pack_into
from .types import GL, NJ, QB, SB, layout

__all__ = ["ACT_EXTRA", "GL", "KERNELS", "NJ", "QB", "SB", "PACKERS", "act_bytes", "act_group", "get_rows",
           "layout", "pack_into", "pack_numpy", "quantize_acts", "quantize_groups"]
