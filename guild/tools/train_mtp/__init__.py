"""`guild train-mtp`: train a multi-token-prediction (MTP) head for a base model that has none, base frozen.

The head is the DeepSeek-V3 / Qwen3.5 form, one block deep:

    h'_t = Block( eh_proj( concat[ RMSNorm_e(emb(x_{t+1})) ; RMSNorm_h(h_t) ] ) )     (embedding first)
    logits(x_{t+2}) = LMHead( RMSNorm_shared_head(h'_t) )

h_t is the base's final hidden state at position t after the base's final norm (rmsnorm of
`ForwardResult.hidden` with output_norm.weight); emb and LMHead are the base's token embedding and output
matrix (frozen, not written).
Block is one layer of the base's kind (llama / qwen3 attention with GQA, RoPE as the base applies it, QK-norm
where the base has it; dense SwiGLU or Mixtral-style routed experts), initialised from the base's last layer;
eh_proj starts as [small random | identity] and enorm/hnorm at the typical RMS of the base's final residual
(~36 on SmolLM2), so that at step 0 the head is the last layer applied once more to the hidden at the scale that
layer was trained on (with unit norms the block's updates swamp the input: half the held-out acceptance after
60 steps in a probe). eh_proj is [dim, 2*dim] (numpy order, out x in): columns 0..dim-1 read the embedding,
dim..2*dim-1 the hidden. MTP row t sits at RoPE position t and attends causally to MTP rows 0..t of its sequence.
FFN matrices written quantised (the base's Q4_0/Q4_1/Q5_0/Q8_0) are trained quantisation-aware (fake-quantised
forward, straight-through gradient), so the file's head is the trained head.

Self-distillation: row t's target is the base's greedy token after x_{t+1} (argmax of the base logits at row
t+1); loss = cross-entropy over the whole vocabulary. Held-out metric = top-1 acceptance, the fraction of
held-out rows whose head argmax equals the target: first-draft acceptance under greedy decoding.

Training data (both permissively licensed or produced here):
1. Python standard library sources (*.py under sysconfig's stdlib, tests excluded) and the Python language
   reference / library topics of `pydoc_data.topics` (PSF License), chosen and cut with a seeded RNG; the
   files and topics the benchmark workloads quote (colorsys.py, sched.py, the compound-statement, exception,
   raise and assert topics and their sub-topics) are left out, so the benchmark stays disjoint.
2. The base model's own greedy generations on the prompts of this module (written for guild, Apache-2.0; in
   the style of workloads/*.yaml but none of their prompts), chat template applied.
The teacher pass (base forward over every document, in chunks of seq_len tokens, state reset per chunk) keeps
token ids, greedy next tokens and the normed hidden (float16) in `<out>.ckpt/data/`; a resumed run reuses them.
~5% of the document groups (a stdlib file, a topic, a prompt) are held out for the acceptance figure.

torch is needed only here (`pip install 'guild[train]'`) and is imported lazily.
"""

from .config import (
    DEFAULT_BATCH,
    DEFAULT_DEPTH,
    DEFAULT_GEN_TOKENS,
    DEFAULT_LR,
    DEFAULT_SEED,
    DEFAULT_SEQ_LEN,
    DEFAULT_STEPS,
    DEFAULT_TEXT_TOKENS,
    FORMAT_VERSION,
    QUANTIZABLE,
    SOURCES,
    SUPPORTED_ARCHS,
    TrainConfig,
    TrainMtpError,
    feature_layers,
)
from .data import PROMPTS, STYLES, generate_documents, prompt_items, text_documents
from .model import _lm_head_ce, base_block, build_head, fake_quant
from .teacher import Dataset, teacher_pass
from .train import evaluate, train_mtp
from .write import dequantized, export_tensors, gguf_name, write_head_gguf, written_type

__all__ = [
    "DEFAULT_BATCH", "DEFAULT_DEPTH", "DEFAULT_GEN_TOKENS", "DEFAULT_LR", "DEFAULT_SEED", "DEFAULT_SEQ_LEN",
    "DEFAULT_STEPS", "DEFAULT_TEXT_TOKENS", "FORMAT_VERSION", "PROMPTS", "QUANTIZABLE", "SOURCES", "STYLES",
    "SUPPORTED_ARCHS", "Dataset", "TrainConfig", "TrainMtpError", "_lm_head_ce", "base_block", "build_head",
    "dequantized", "evaluate", "export_tensors", "fake_quant", "feature_layers", "generate_documents", "gguf_name",
    "prompt_items", "teacher_pass", "text_documents", "train_mtp", "write_head_gguf", "written_type",
]
