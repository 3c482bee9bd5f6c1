"""`guild train-mtp`: train a multi-token-prediction (MTP) head for a base model that has none, base frozen.

The head is the DeepSeek-V3 / Qwen3.5 form, one block deep:

    h'_t = Block( eh_proj( concat[ RMSNorm_e(emb(x_{t+1})) ; RMSNorm_h(h_t) ] ) )     (embedding first)
    logits(x_{t+2}) = LMHead( RMSNorm_shared_head(h'_t) )

h_t is the base's final hidden state at position t after the base's final norm (rmsnorm of `state.hidden` with
output_norm.weight); emb and LMHead are the base's token embedding and output matrix (frozen, not written).
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

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .errors import BadFlagError, GuildError, UnsupportedArchitectureError
from .files import atomic_path

FORMAT_VERSION = 1  # bump when the data, the head or the checkpoint layout changes
SOURCES = ("Python standard library sources (*.py, PSF License) and pydoc_data.topics (Python documentation, "
           "PSF License); the base model's own greedy generations on guild's training prompts (Apache-2.0)")
SUPPORTED_ARCHS = ("llama", "qwen3", "qwen3moe")

# defaults (sized for the embedded model on a 2-core machine: see TIME_BUDGET and the module report)
# Measured on the embedded MoE, 2 threads: teacher pass ~205 rows/s, generation ~45 generated tokens/s (8
# sessions batched, prompts and teacher pass included), training ~0.8 ms per row (a step of 8 x 511 rows ~3.2 s):
# text ~10 min + generations ~7 min + training ~13 min + load/eval ~1 min, about 30-35 minutes in all.
DEFAULT_STEPS = 250
DEFAULT_TEXT_TOKENS = 120_000
DEFAULT_GEN_TOKENS = 20_000
DEFAULT_SEQ_LEN = 512
DEFAULT_BATCH = 8
DEFAULT_LR = 1e-3
DEFAULT_SEED = 0
HELDOUT_FRACTION = 0.05
GEN_MAX_TOKENS = 192  # per generated turn
GEN_BATCH = 8  # sessions decoded together
DRAFT_VOCAB = 8192
EMB_INIT_REL = 0.25  # eh_proj's embedding half starts N(0, EMB_INIT_REL / sqrt(dim)): ~25% of the hidden's share
CE_CHUNK = 1024  # rows per LM-head block in the fused cross-entropy
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")

# Workload texts (workloads/texts/*.txt) come from these: leave them out of the training text.
EXCLUDED_STDLIB = frozenset({"colorsys.py", "sched.py"})
EXCLUDED_TOPICS = frozenset({"assert", "compound", "else", "exceptions", "execmodel", "for", "if", "raise", "try",
                             "while", "with"})


class TrainMtpError(BadFlagError):
    """A bad train-mtp argument or an input it cannot train on."""


def _torch():
    try:
        import torch
    except ImportError:
        raise GuildError("train-mtp needs torch: pip install 'guild[train]'") from None
    return torch


@dataclass(frozen=True)
class TrainConfig:
    base_digest: str
    text_tokens: int
    gen_tokens: int
    seq_len: int
    seed: int
    steps: int
    batch: int
    lr: float
    version: int = FORMAT_VERSION

    def data_key(self, part: str) -> dict:
        """What determines one part of the teacher data ("text" or "gen")."""
        budget = self.text_tokens if part == "text" else self.gen_tokens
        return {"part": part, "budget": budget, **{k: getattr(self, k) for k in ("base_digest", "seq_len", "seed",
                                                                                  "version")}}

    def as_dict(self) -> dict:
        return asdict(self)


# =========================================================================================================
# Training prompts (written for guild; the style of workloads/*.yaml, none of their prompts)
# =========================================================================================================
# {code}: a seeded excerpt of a stdlib module; {doc}: a seeded excerpt of a pydoc topic; {longdoc}: a longer one.
PROMPTS: tuple = (
    # code editing
    "Add a docstring to every function in this code and return the whole code in one Python block.\n\n```python\n"
    "{code}\n```",
    "Rewrite this code so that every string is formatted with f-strings; change nothing else.\n\n```python\n"
    "{code}\n```",
    "Find one possible bug or edge case in this code and show a fixed version of the affected function.\n\n"
    "```python\n{code}\n```",
    "Rename the local variables in this code to longer, descriptive names and return the full code.\n\n"
    "```python\n{code}\n```",
    "Add logging calls (module logger, debug level) at the start of each function in this code.\n\n```python\n"
    "{code}\n```",
    "Explain line by line what this code does.\n\n```python\n{code}\n```",
    "Write pytest tests for the functions in this code.\n\n```python\n{code}\n```",
    "Convert the comments in this code into proper docstrings where possible and return the code.\n\n"
    "```python\n{code}\n```",
    "Refactor this function to use early returns instead of nested if statements:\n\n```python\n"
    "def grade(score):\n    if score >= 0:\n        if score >= 90:\n            return 'A'\n        else:\n"
    "            if score >= 75:\n                return 'B'\n            else:\n                return 'C'\n"
    "    else:\n        raise ValueError('negative score')\n```",
    "Make this JavaScript function handle an empty array and return 0 for it:\n\n```js\nfunction average(xs) {\n"
    "  let total = 0;\n  for (const x of xs) total += x;\n  return total / xs.length;\n}\n```",
    # summarisation
    "Summarise the following documentation in four bullet points.\n\n{doc}",
    "Write a one-paragraph summary of this text for a busy developer.\n\n{doc}",
    "Give a TL;DR of the following in two sentences.\n\n{doc}",
    "List the key terms defined in this text, each with a one-line definition.\n\n{doc}",
    "Summarise what this Python module is for and name its main functions or classes.\n\n```python\n{code}\n```",
    # JSON / structured output
    "Return a JSON object with the keys name, age and city for this sentence: 'Priya Raman, 29, moved to "
    "Toronto last spring.' Reply with JSON only.",
    "Produce a JSON array of five classic novels, each an object with title, author and year.",
    "Convert this list to JSON with the fields sku, qty and price: 'A-100 x3 at 4.50; B-220 x1 at 19.99; "
    "C-310 x12 at 0.75'. Reply with one ```json block.",
    "Write a JSON Schema for a blog post with a title, a body, an author object (name, email) and a list of tags.",
    "Turn this meeting note into JSON with date, attendees (a list) and action_items (a list of objects with "
    "owner and task): 'On 12 May, Ana, Ben and Chen met. Ana will draft the budget; Ben books the venue.'",
    "Give me a YAML configuration for a web service with host, port, log level and a list of two database "
    "replicas.",
    "Output a CSV table with the columns country, capital and population (millions) for six European countries.",
    "Describe a weather report for three cities as a JSON list of objects with city, temp_c and conditions.",
    # RAG Q&A
    "Answer the question using only the document below.\n\nDocument:\n{doc}\n\nQuestion: What is the main rule "
    "or behaviour this document describes? Quote one sentence that supports your answer.",
    "Read the documentation excerpt and answer: which syntax or names does it introduce?\n\n{doc}",
    "Using only this source code, explain what happens when the first function is called with invalid input."
    "\n\n```python\n{code}\n```",
    "Here is a section of a reference manual.\n\n{longdoc}\n\nQuestion: According to the text, what are the "
    "exceptions or special cases mentioned? Answer in three sentences.",
    "Based on the following text, write three quiz questions with their answers.\n\n{doc}",
    # boilerplate
    "Write a Python dataclass `Book` with title, author, isbn and year, plus a function that loads a list of "
    "books from a CSV file.",
    "Write a minimal Flask app with routes to list, create and delete todo items stored in memory.",
    "Write a Python command-line tool with argparse that counts lines, words and characters in files.",
    "Create a unittest.TestCase skeleton for a class `Inventory` with methods add, remove and total.",
    "Write SQL CREATE TABLE statements for customers, orders and order_items with foreign keys.",
    "Write a Dockerfile for a Python 3.11 web application that installs requirements.txt and runs gunicorn.",
    "Write a GitHub Actions workflow that runs pytest on Python 3.10 and 3.11.",
    "Write an HTML page with a header, a navigation bar with three links, and a footer.",
    "Write a Python class `LRUCache` with get and put methods and a fixed capacity.",
    "Write a bash script that backs up a directory into a dated tar.gz archive and keeps the last seven.",
    "Write a TypeScript interface and a function that validates a user object with id, email and roles.",
    "Write a Makefile with targets install, test, lint and clean for a Python project.",
    "Write a Python context manager that times a block of code and prints the elapsed seconds.",
    "Write a Rust function that parses a comma-separated line into a vector of integers.",
    # creative prose
    "Write a short story about a clockmaker who discovers that one of her clocks runs backwards.",
    "Write a poem of four stanzas about the first snowfall in a big city.",
    "Describe an abandoned railway station at dawn in one vivid paragraph.",
    "Write a dialogue between a robot gardener and a curious child.",
    "Write the opening paragraph of a mystery novel set on a night train across the mountains.",
    "Write a fable about a tortoise who wants to learn to fly, with a moral at the end.",
    "Write a letter from an astronaut on a long mission to her younger brother on Earth.",
    "Write a short science-fiction scene in which a city's power grid becomes self-aware.",
    # math reasoning
    "Solve step by step: a train travels 180 km in 2.5 hours, then 120 km in 1.5 hours. What is its average "
    "speed over the whole trip?",
    "Solve step by step: a shop discounts a jacket by 20% and then by another 10%. What is the total discount "
    "as a percentage of the original price?",
    "A rectangle has a perimeter of 46 cm and its length is 5 cm more than its width. Find its area, showing "
    "your work.",
    "Three workers paint a fence in 6 hours. How long would five workers take at the same rate? Explain.",
    "Solve for x step by step: 3(x - 4) + 7 = 2x + 9.",
    "What is the sum of all even numbers from 2 to 100? Show your reasoning.",
    "A savings account pays 4% interest per year, compounded yearly. How much does 2,500 dollars become after "
    "three years? Show each year.",
    "A recipe for 6 people uses 450 g of flour and 3 eggs. How much of each is needed for 10 people? Explain.",
    # short chat
    "What is the difference between a list and a tuple in Python?",
    "Give me three ideas for a rainy weekend at home.",
    "How do I politely decline a meeting invitation? Keep it short.",
    "Why is the sky blue? Answer in two sentences.",
    "What should I pack for a three-day hiking trip?",
    "Explain recursion to a ten-year-old.",
    "What does HTTP status 404 mean, and how is it different from 500?",
    "Recommend a simple routine to start running as a beginner.",
    "What are the pros and cons of working from home?",
    "How do vaccines train the immune system? Be brief.",
    "What is a hash table and why are lookups fast?",
    "Translate 'Where is the nearest library?' into French, Spanish and German.",
    # multi-turn conversations (lists of user turns)
    ("I want to learn Python. Where should I start?", "Which book or course would you recommend first?",
     "Give me a one-week study plan."),
    ("Write a Python function that checks whether a string is a palindrome.",
     "Now make it ignore spaces, punctuation and case.", "Add doctests to it."),
    ("What is a virtual environment in Python?", "How do I create one and install packages into it?"),
    ("Help me plan a small birthday party for eight people.", "The budget is 150 dollars. Adjust the plan.",
     "Write the invitation text."),
    ("Explain what a REST API is.", "Show an example request and response for creating a user.",
     "How should errors be reported?"),
    ("Here is some code:\n\n```python\n{code}\n```\n\nWhat does it do?", "How could it be made faster or simpler?"),
    ("Summarise this text in three sentences:\n\n{doc}", "Now explain it with a simple example."),
)

STYLES = ("", " Keep the answer short.", " Answer as a numbered list.", " Explain it to a beginner.",
          " Be precise and technical.", " Use a friendly, informal tone.", " Give an example.")


# =========================================================================================================
# Text sources
# =========================================================================================================
def _stdlib_files() -> list[Path]:
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts) and p.name not in
             EXCLUDED_STDLIB]
    return sorted(files, key=lambda p: str(p.relative_to(root)))


def _topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python built without its documentation
        return {}
    return {k: v for k, v in sorted(topics.items()) if k not in EXCLUDED_TOPICS}


def _read(p: Path) -> str | None:
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _excerpt(text: str, rng: np.random.Generator, n_lines: int) -> str:
    """n_lines consecutive lines of text from a seeded start (the beginning half of the time)."""
    lines = text.splitlines()
    if len(lines) <= n_lines:
        return text.strip("\n")
    start = 0 if rng.random() < 0.5 else int(rng.integers(0, len(lines) - n_lines + 1))
    return "\n".join(lines[start : start + n_lines]).strip("\n")


WRAPS = ("Here is a file from a project:", "Read the following text.", "Look at this:", "Context:",
         "I found this in the documentation.", "Please review the following.")


def text_documents(tok, budget: int, seed: int, max_doc_tokens: int) -> list[tuple[str, list[int]]]:
    """(group, token ids) documents from the stdlib sources (60%) and the pydoc topics (40%), in a seeded order,
    each cut to max_doc_tokens, until `budget` tokens in all. Half of them are quoted in a chat user turn (the
    chat template applied, as the workloads quote code and documents), the others are raw text."""
    rng = np.random.default_rng([seed, 1])
    docs: list[tuple[str, list[int]]] = []
    files, topics = _stdlib_files(), _topics()
    code_share = int(budget * 0.6) if topics else budget
    for kind, items, share in (("code", files, code_share), ("doc", sorted(topics), budget - code_share)):
        got = 0
        for i in rng.permutation(len(items)) if items else ():
            if got >= share:
                break
            if kind == "code":
                text, group = _read(items[i]), f"code:{items[i].parent.name}/{items[i].name}"
                if text is None or len(text) < 200:
                    continue
            else:
                text, group = topics[items[i]], f"doc:{items[i]}"
            text = _excerpt(text, rng, max_doc_tokens // 4 + 10)  # >= ~4 tokens a line: cut to size below
            if rng.random() < 0.5:
                fence = "```python\n" if kind == "code" else ""
                msg = f"{WRAPS[int(rng.integers(len(WRAPS)))]}\n\n{fence}{text}{chr(10) + '```' if fence else ''}"
                try:
                    text = tok.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True)
                    ids = tok.encode(text, add_special=True)
                except GuildError:
                    ids = tok.encode(text, add_special=True, parse_special=False)
            else:
                ids = tok.encode(text, add_special=True, parse_special=False)
            ids = ids[: min(max_doc_tokens, share - got + 2)]
            if len(ids) < 8:
                continue
            docs.append((group, ids))
            got += len(ids)
    return docs


def prompt_items(seed: int):
    """Seeded (group, user turns) items, lazily: pass p over PROMPTS (shuffled) adds style p and fresh excerpts;
    after len(STYLES) passes only the prompts with excerpts continue (len(STYLES) * 3 passes in all)."""
    files = _stdlib_files()
    topics = _topics()
    names = sorted(topics)
    for p in range(len(STYLES) * 3):
        rng = np.random.default_rng([seed, 2, p])
        order = rng.permutation(len(PROMPTS))
        for i in order:
            turns = PROMPTS[i] if isinstance(PROMPTS[i], tuple) else (PROMPTS[i],)
            style = STYLES[(p + int(i)) % len(STYLES)] if p else ""
            templated = any("{" + s + "}" in t for t in turns for s in ("code", "doc", "longdoc"))
            if not templated and p >= len(STYLES):
                continue  # self-contained prompts: one per style, then no repeats
            fill = {}
            for _ in range(20):  # a readable stdlib file
                if not files:
                    break
                text = _read(files[int(rng.integers(len(files)))])
                if text and len(text) > 500:
                    fill["code"] = _excerpt(text, rng, 24)
                    break
            fill.setdefault("code", "def add(a, b):\n    return a + b")
            if names:
                t = topics[names[int(rng.integers(len(names)))]]
                fill["doc"], fill["longdoc"] = _excerpt(t, rng, 20), _excerpt(t, rng, 60)
            else:
                fill["doc"] = fill["longdoc"] = fill["code"]
            out = tuple(t.replace("{code}", fill["code"]).replace("{doc}", fill["doc"])
                        .replace("{longdoc}", fill["longdoc"]) for t in turns)
            out = (out[0] + style, *out[1:])
            yield f"gen:{i}", out


def generate_documents(model, tok, budget: int, seed: int, n_ctx: int, advance: Callable[[int], None]):
    """The base's greedy chat generations on prompt_items until `budget` generated tokens: (group, ids of the
    whole conversation), GEN_BATCH conversations decoded together, turn by turn."""
    from itertools import islice

    from .chat import Conversation
    from .errors import ContextOverflowError
    from .session import GuildSession, generate_concurrent

    docs: list[tuple[str, list[int]]] = []
    items = prompt_items(seed)
    generated = 0
    while generated < budget:
        remaining = budget - generated
        max_new = min(GEN_MAX_TOKENS, max(16, remaining))
        batch = list(islice(items, min(GEN_BATCH, max(1, math.ceil(remaining / (0.5 * max_new))))))
        if not batch:
            break
        convs = [Conversation(GuildSession(model, n_ctx=n_ctx, eos_ids=tok.eos_ids), tok) for _ in batch]
        alive = list(range(len(batch)))
        for turn in range(max(len(t) for _, t in batch)):
            reqs, who = [], []
            for j in alive:
                turns = batch[j][1]
                if turn >= len(turns):
                    continue
                ids = convs[j].prepare(turns[turn])
                if convs[j].session.state.pos + len(ids) + max_new >= n_ctx:
                    continue  # would not fit: the conversation ends here
                reqs.append((convs[j].session, dict(prompt=ids, max_tokens=max_new)))
                who.append(j)
            if not reqs:
                break
            try:
                results, _ = generate_concurrent(reqs)
            except ContextOverflowError:
                break
            for j, (out, _) in zip(who, results, strict=True):
                convs[j].record(tok.decode([t for t in out if t not in tok.eos_ids]))
                generated += len(out)
                advance(len(out))
            alive = who
        for (group, _), c in zip(batch, convs, strict=True):
            if len(c.session.tokens) >= 8:
                docs.append((group, list(c.session.tokens)))
    return docs


# =========================================================================================================
# Teacher pass: base forward → (tokens, greedy next token, normed hidden)
# =========================================================================================================
def teacher_pass(model, docs, seq_len: int, advance: Callable[[int], None]) -> dict:
    """Each document cut into chunks of seq_len tokens (state reset per chunk); per row: the token, the base's
    greedy next token and the final hidden after the base's output norm (float16)."""
    from .kernels.cpu import ops

    a = model.args
    toks, greedy, hidden, rms, lens, groups = [], [], [], [], [], []
    state = model.new_state(seq_len)
    for group, ids in docs:
        ids = np.asarray(ids, np.int64)
        for s in range(0, ids.size, seq_len):
            chunk = ids[s : s + seq_len]
            if chunk.size < 3:
                continue
            state.truncate(0)
            logits = model.forward(chunk, state)
            x = np.ascontiguousarray(state.hidden, np.float32)
            state.commit(0)
            hn = np.empty_like(x)
            ops.rmsnorm(x, model.out_norm, a.norm_eps, hn)
            toks.append(chunk.astype(np.int32))
            greedy.append(logits.argmax(-1).astype(np.int32))
            hidden.append(hn.astype(np.float16))
            rms.append(np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1)).astype(np.float32))
            lens.append(chunk.size)
            groups.append(group)
            advance(int(chunk.size))
    dim = a.dim
    return {
        "tokens": np.concatenate(toks) if toks else np.zeros(0, np.int32),
        "greedy": np.concatenate(greedy) if greedy else np.zeros(0, np.int32),
        "hidden": np.concatenate(hidden) if hidden else np.zeros((0, dim), np.float16),
        "rms": np.concatenate(rms) if rms else np.zeros(0, np.float32),
        "lens": np.asarray(lens, np.int64),
        "groups": np.asarray(groups, dtype=object).astype(str) if groups else np.zeros(0, "<U1"),
    }


def _save_npz(path: Path, arrays: dict, meta: dict) -> None:
    with atomic_path(path, "the teacher data") as tmp, open(tmp, "wb") as f:
        np.savez(f, meta=np.asarray(json.dumps(meta, sort_keys=True)), **arrays)


def _load_npz(path: Path, meta: dict) -> dict | None:
    """The arrays saved at `path` if its meta equals `meta`, else None."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if json.loads(str(z["meta"])) != json.loads(json.dumps(meta, sort_keys=True)):
                return None
            out = {k: z[k] for k in z.files if k != "meta"}
            return out if set(DATA_ARRAYS) <= set(out) else None
    except (OSError, ValueError, KeyError):
        return None


DATA_ARRAYS = ("tokens", "greedy", "hidden", "rms", "lens", "groups")


@dataclass
class Dataset:
    tokens: np.ndarray  # int32 [R] every chunk's rows, concatenated
    greedy: np.ndarray  # int32 [R] the base's greedy next token at each row
    hidden: np.ndarray  # float16 [R, dim] normed final hidden
    rms: np.ndarray  # float32 [R] RMS of the final hidden before the norm
    starts: np.ndarray  # int64 [C] first row of each chunk
    lens: np.ndarray  # int64 [C]
    groups: np.ndarray  # str [C] document group (a file, a topic, a prompt)
    sources: np.ndarray  # int8 [C] 0 text, 1 generations

    @classmethod
    def join(cls, parts: list[dict]) -> Dataset:
        lens = np.concatenate([p["lens"] for p in parts]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        return cls(
            tokens=np.concatenate([p["tokens"] for p in parts]),
            greedy=np.concatenate([p["greedy"] for p in parts]),
            hidden=np.concatenate([p["hidden"] for p in parts]),
            rms=np.concatenate([p["rms"] for p in parts]),
            starts=starts, lens=lens,
            groups=np.concatenate([p["groups"].astype(str) for p in parts]),
            sources=np.concatenate([np.full(p["lens"].size, s, np.int8) for s, p in enumerate(parts)]),
        )

    def split(self, seed: int, fraction: float = HELDOUT_FRACTION) -> tuple[np.ndarray, np.ndarray]:
        """(train chunk ids, held-out chunk ids): a seeded `fraction` of the document groups (at least one)."""
        names = np.unique(self.groups)
        if names.size < 2:
            raise TrainMtpError(f"the training budgets gave {names.size} document(s); at least 2 are needed to hold "
                                "one out (raise --text-tokens or --gen-tokens)")
        rng = np.random.default_rng([seed, 3])
        n_hold = max(1, int(round(fraction * names.size)))
        held = set(names[rng.permutation(names.size)[:n_hold]].tolist())
        mask = np.array([g in held for g in self.groups])
        return np.flatnonzero(~mask), np.flatnonzero(mask)

    def rows(self, chunks: np.ndarray) -> int:
        """MTP rows in these chunks (L - 1 per chunk of L tokens)."""
        return int((self.lens[chunks] - 1).sum())

    def batch(self, chunks: np.ndarray):
        """(hn [B, T, dim] f32, next tokens [B, T] i64, targets [B, T] i64, valid [B, T] bool), T = max L - 1:
        MTP row t of a chunk reads the hidden at t and the token at t+1, and targets the greedy token at t+1."""
        T = int(self.lens[chunks].max()) - 1
        B = chunks.size
        dim = self.hidden.shape[1]
        hn = np.zeros((B, T, dim), np.float32)
        nxt = np.zeros((B, T), np.int64)
        tgt = np.zeros((B, T), np.int64)
        valid = np.zeros((B, T), bool)
        for b, c in enumerate(chunks):
            s, n = int(self.starts[c]), int(self.lens[c]) - 1
            hn[b, :n] = self.hidden[s : s + n]
            nxt[b, :n] = self.tokens[s + 1 : s + n + 1]
            tgt[b, :n] = self.greedy[s + 1 : s + n + 1]
            valid[b, :n] = True
        return hn, nxt, tgt, valid


# =========================================================================================================
# Base weights and the torch head
# =========================================================================================================
BLOCK_TENSORS_ATTN = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output")
FFN_DENSE = ("ffn_gate", "ffn_up", "ffn_down")
FFN_MOE = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def base_block(g, args) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The base's last layer dequantised to float32 ({short name: array}, numpy shapes as in the GGUF) and the
    quant type names of its tensors."""
    from .gguf import f32

    p = f"blk.{args.n_layers - 1}."
    names = list(BLOCK_TENSORS_ATTN)
    if args.qk_norm:
        names += ["attn_q_norm", "attn_k_norm"]
    names += ["ffn_norm", *(FFN_MOE if args.is_moe else FFN_DENSE)]
    weights, qtypes = {}, {}
    for n in names:
        t = g.tensor(p + n + ".weight")
        weights[n] = np.array(f32(t), np.float32)  # a writable copy (f32 may return the mmap)
        qtypes[n] = t.qtype.name
    return weights, qtypes


def fake_quant(torch, w, qtype: str):
    """w rounded as gguf.quants.quantize + dequantize would round it (Q4_0, Q4_1, Q5_0, Q8_0: blocks of 32 along
    the last axis, f16 scales), with a straight-through gradient: quantisation-aware training, so that the
    head written in the base's quant type is the head that was trained."""
    b = w.detach().reshape(-1, 32)
    if qtype == "Q4_1":
        mx, mn = b.amax(-1, keepdim=True), b.amin(-1, keepdim=True)
        d = (mx - mn) / 15
        q = torch.trunc((b - mn) * torch.where(d == 0, 0.0, 1.0 / d) + 0.5).clamp(0, 15)
        deq = q * d.half().float() + mn.half().float()
    elif qtype in ("Q4_0", "Q5_0"):
        n = 8.0 if qtype == "Q4_0" else 16.0
        d = b.gather(-1, b.abs().argmax(-1, keepdim=True)) / -n
        q = torch.trunc(b * torch.where(d == 0, 0.0, 1.0 / d) + (n + 0.5)).clamp(0, 2 * n - 1)
        deq = (q - n) * d.half().float()
    elif qtype == "Q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        x = b * torch.where(d == 0, 0.0, 1.0 / d)
        a = x.abs()
        q = torch.sign(x) * (torch.floor(a) + torch.floor(2 * (a - torch.floor(a))))
        deq = q * d.half().float()
    else:
        raise ValueError(f"fake_quant: {qtype}")
    return deq.view(w.shape) + (w - w.detach())  # the value deq exactly, the gradient 1


def build_head(torch, args, block: dict, out_norm: np.ndarray, seq_len: int, seed: int,
               emb_std: float | None = None, hidden_scale: float = 1.0, qtypes: dict | None = None):
    """The MTP head module, initialised from the base's last layer (see the module docstring).

    eh_proj = [N(0, emb_std) | identity] (emb_std default EMB_INIT_REL / sqrt(dim)); enorm and hnorm start at
    `hidden_scale` (the typical RMS of the base's final residual, so the block sees inputs of the scale the
    base's last layer was trained on), shared_head_norm at the base's output_norm. `qtypes`: {tensor: quant
    type} of the FFN matrices that will be written quantised: the forward uses them fake-quantised."""
    from .kernels.ref import rope_tables

    nn, F = torch.nn, torch.nn.functional
    dim, H, Hkv, hd, eps = args.dim, args.n_heads, args.n_kv_heads, args.head_dim, args.norm_eps
    n_rot = args.rope_dim or hd

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    class MtpHead(nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(int(seed))
            eh = torch.zeros(dim, 2 * dim)
            std = EMB_INIT_REL / math.sqrt(dim) if emb_std is None else emb_std
            eh[:, :dim] = torch.randn(dim, dim, generator=gen) * std
            eh[:, dim:] = torch.eye(dim)
            self.quant = {k: t for k in block if (t := written_type(k, qtypes or {})) in QUANTIZABLE}
            self.p = nn.ParameterDict({
                "eh_proj": nn.Parameter(eh),
                "enorm": nn.Parameter(torch.full((dim,), float(hidden_scale))),
                "hnorm": nn.Parameter(torch.full((dim,), float(hidden_scale))),
                "shared_head_norm": nn.Parameter(torch.from_numpy(np.array(out_norm, np.float32))),
                **{k: nn.Parameter(torch.from_numpy(np.array(v, np.float32))) for k, v in block.items()},
            })
            cos, sin = rope_tables(max(seq_len, 1), n_rot, args.rope_base)
            self.register_buffer("cos", torch.from_numpy(cos), persistent=False)
            self.register_buffer("sin", torch.from_numpy(sin), persistent=False)

        def rope(self, x):  # x [B, T, h, hd]
            T = x.shape[1]
            c, s = self.cos[:T, None, :], self.sin[:T, None, :]
            rot, rest = x[..., :n_rot], x[..., n_rot:]
            if args.rope_neox:
                a, b = rot[..., : n_rot // 2], rot[..., n_rot // 2 :]
                rot = torch.cat([a * c - b * s, a * s + b * c], -1)
            else:
                a, b = rot[..., 0::2], rot[..., 1::2]
                rot = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
            return torch.cat([rot, rest], -1)

        def block(self, x):
            """One base-kind layer over x [B, T, dim] at positions 0..T-1, causal."""
            p = self.p
            B, T, _ = x.shape
            n = rms(x, p["attn_norm"])
            q = (n @ p["attn_q"].T).view(B, T, H, hd)
            k = (n @ p["attn_k"].T).view(B, T, Hkv, hd)
            v = (n @ p["attn_v"].T).view(B, T, Hkv, hd)
            if "attn_q_norm" in p:
                q, k = rms(q, p["attn_q_norm"]), rms(k, p["attn_k_norm"])
            q, k = self.rope(q), self.rope(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if Hkv != H:
                k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(hd))
            x = x + att.transpose(1, 2).reshape(B, T, H * hd) @ p["attn_output"].T
            n = rms(x, p["ffn_norm"])
            return x + (self.moe(n) if "ffn_gate_inp" in p else self.dense(n))

        def w(self, name):
            """A weight as the forward uses it: fake-quantised when it will be written quantised."""
            q = self.quant.get(name)
            return self.p[name] if q is None else fake_quant(torch, self.p[name], q)

        def dense(self, n):
            gate, up, down = self.w("ffn_gate"), self.w("ffn_up"), self.w("ffn_down")
            return (F.silu(n @ gate.T) * (n @ up.T)) @ down.T

        def moe(self, n):
            p = self.p
            gate, up, down = self.w("ffn_gate_exps"), self.w("ffn_up_exps"), self.w("ffn_down_exps")
            shape = n.shape
            h = n.reshape(-1, shape[-1])
            probs = torch.softmax(h @ p["ffn_gate_inp"].T, -1)
            w, ids = torch.topk(probs, args.n_experts_used, -1)
            if args.norm_topk_prob:
                w = w / w.sum(-1, keepdim=True)
            out = torch.zeros_like(h)
            for e in range(args.n_experts):
                rows, slot = torch.nonzero(ids == e, as_tuple=True)
                if rows.numel() == 0:
                    continue
                xe = h[rows]
                y = (F.silu(xe @ gate[e].T) * (xe @ up[e].T)) @ down[e].T
                out = out.index_add(0, rows, y * w[rows, slot, None])
            return out.view(shape)

        def forward(self, hn, emb_next):
            """hn [B, T, dim] base normed hidden, emb_next [B, T, dim] embedding of the next token → the normed
            head output [B, T, dim] (shared_head_norm applied; the LM head comes after)."""
            p = self.p
            x = torch.cat([rms(emb_next, p["enorm"]), rms(hn, p["hnorm"])], -1) @ p["eh_proj"].T
            return rms(self.block(x), p["shared_head_norm"])

    return MtpHead()


def _lm_head_ce(torch):
    """Cross-entropy over the whole vocabulary through a frozen LM head, fused and chunked: the forward computes
    the loss, each row's argmax and the gradient w.r.t. the input at once, never holding [R, vocab] logits."""

    class LMHeadCE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, W, targets):
            R = x.shape[0]
            grad = torch.empty_like(x)
            loss = x.new_zeros(())
            pred = torch.empty(R, dtype=torch.int64)
            for s in range(0, R, CE_CHUNK):
                e = min(R, s + CE_CHUNK)
                lg = x[s:e] @ W.T
                t = targets[s:e]
                pred[s:e] = lg.argmax(-1)
                lse = torch.logsumexp(lg, -1)
                loss = loss + (lse - lg.gather(1, t[:, None])[:, 0]).sum()
                p = lg.sub_(lse[:, None]).exp_()
                p[torch.arange(e - s), t] -= 1.0
                grad[s:e] = p @ W
            ctx.save_for_backward(grad)
            ctx.mark_non_differentiable(pred)
            return loss / R, pred

        @staticmethod
        def backward(ctx, g_loss, g_pred):
            (grad,) = ctx.saved_tensors
            return grad * (g_loss / grad.shape[0]), None, None

    return LMHeadCE.apply


# =========================================================================================================
# Export
# =========================================================================================================
NEXTN = {"eh_proj": "blk.0.nextn.eh_proj.weight", "enorm": "blk.0.nextn.enorm.weight",
         "hnorm": "blk.0.nextn.hnorm.weight", "shared_head_norm": "blk.0.nextn.shared_head_norm.weight"}
F32_TENSORS = frozenset({"enorm", "hnorm", "shared_head_norm", "attn_norm", "attn_q_norm", "attn_k_norm",
                         "ffn_norm", "ffn_gate_inp"})


def gguf_name(key: str) -> str:
    return NEXTN.get(key, f"blk.0.{key}.weight")


def written_type(key: str, qtypes: dict[str, str]) -> str:
    """The type a head tensor is written in: norms and the router F32; FFN matrices in the base's type when
    gguf.quants can write it (Q4_0/Q4_1/Q5_0/Q8_0); everything else (attention, eh_proj) F16."""
    if key in F32_TENSORS:
        return "F32"
    if key.startswith("ffn_") and qtypes.get(key) in QUANTIZABLE:
        return qtypes[key]
    return "F16"


def export_tensors(params: dict[str, np.ndarray], qtypes: dict[str, str]) -> list[tuple[str, np.ndarray, str]]:
    """(GGUF name, data as written, type name) per head tensor: norms and router F32, FFN matrices in the base's
    type when gguf.quants can write it (Q4_0/Q4_1/Q5_0/Q8_0), everything else F16."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    out = []
    for key, w in params.items():
        w = np.ascontiguousarray(w, np.float32)
        typ = written_type(key, qtypes)
        if typ == "F32":
            out.append((gguf_name(key), w, typ))
        elif typ == "F16":
            out.append((gguf_name(key), w.astype(np.float16), typ))
        else:
            out.append((gguf_name(key), quantize(w, GGMLQuantizationType[typ]), typ))
    return out


def dequantized(tensors: list[tuple[str, np.ndarray, str]], shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    """The float32 values the written tensors carry (what inference will compute with), by GGUF name."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out = {}
    for name, data, typ in tensors:
        if typ in ("F32", "F16"):
            out[name] = data.astype(np.float32)
        else:
            out[name] = dequantize(data, GGMLQuantizationType[typ]).astype(np.float32).reshape(shapes[name])
    return out


def write_head_gguf(path: Path, tensors, meta: dict) -> int:
    """Write the head GGUF atomically (temp file + rename); returns its size in bytes."""
    from gguf import GGMLQuantizationType, GGUFWriter

    path = Path(path)
    with atomic_path(path, "the MTP head") as tmp:
        w = GGUFWriter(tmp, "guild-mtp")
        try:
            for k, v in meta.items():
                if isinstance(v, bool):
                    w.add_bool(k, v)
                elif isinstance(v, int):
                    w.add_uint64(k, v) if v >= 2**32 else w.add_uint32(k, v)
                elif isinstance(v, float):
                    w.add_float32(k, v)
                else:
                    w.add_string(k, str(v))
            for name, data, typ in tensors:
                raw = None if typ in ("F32", "F16", "I32") else GGMLQuantizationType[typ]
                w.add_tensor(name, data, raw_dtype=raw)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()
    return path.stat().st_size


# =========================================================================================================
# Progress
# =========================================================================================================
class _Bars:
    """rich progress bars on stderr (or nothing): bar(description, total, unit) → advance(n, **fields)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._progress = None
        self.console = None
        if enabled:
            from rich.console import Console

            self.console = Console(stderr=True, highlight=False)

    def log(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(f"[dim]{msg}[/]")

    def bar(self, description: str, total: int, unit: str):
        if not self.enabled:
            return lambda n=1, **kw: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if self._progress is None:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[unit]} {task.fields[info]}"), TimeElapsedColumn(),
                                      TextColumn("eta"), TimeRemainingColumn(), console=self.console)
            self._progress.start()
        task = self._progress.add_task(description, total=total, info="", unit=unit)
        prog = self._progress

        def advance(n: int = 1, **fields) -> None:
            info = " · ".join(f"{k} {v}" for k, v in fields.items())
            prog.update(task, advance=n, **({"info": info} if fields else {}))

        return advance

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


# =========================================================================================================
# Training
# =========================================================================================================
def _lr_at(step: int, steps: int, lr: float) -> float:
    warm = min(50, max(1, steps // 10))
    if step < warm:
        return lr * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))


def _batch_chunks(train: np.ndarray, batch: int, seed: int, step: int) -> np.ndarray:
    """The chunks of a step: a function of (seed, step) only, so a resumed run draws the same batches."""
    rng = np.random.default_rng([seed, 4, step])
    return train[np.sort(rng.choice(train.size, size=min(batch, train.size), replace=False))]


def evaluate(torch, head, emb, lm_head, ds: Dataset, chunks: np.ndarray, draft_vocab: np.ndarray | None = None,
             batch: int = 8) -> dict:
    """Held-out top-1 acceptance (head argmax == base greedy target), mean loss, and with a draft vocabulary its
    coverage of the targets and the acceptance of an argmax restricted to it."""
    n = correct = correct_dv = covered = 0
    loss = 0.0
    dv = None if draft_vocab is None else torch.from_numpy(np.asarray(draft_vocab, np.int64))
    in_dv = None
    if dv is not None:
        in_dv = torch.zeros(lm_head.shape[0], dtype=torch.bool)
        in_dv[dv] = True
    with torch.no_grad():
        for i in range(0, chunks.size, batch):
            hn, nxt, tgt, valid = ds.batch(chunks[i : i + batch])
            m = torch.from_numpy(valid)
            y = head(torch.from_numpy(hn), emb[torch.from_numpy(nxt)])[m]
            t = torch.from_numpy(tgt)[m]
            for s in range(0, y.shape[0], CE_CHUNK):
                lg = y[s : s + CE_CHUNK] @ lm_head.T
                tt = t[s : s + CE_CHUNK]
                loss += float((torch.logsumexp(lg, -1) - lg.gather(1, tt[:, None])[:, 0]).sum())
                correct += int((lg.argmax(-1) == tt).sum())
                if dv is not None:
                    correct_dv += int((dv[lg[:, dv].argmax(-1)] == tt).sum())
                    covered += int(in_dv[tt].sum())
                n += tt.numel()
    out = {"rows": n, "acceptance": correct / n if n else float("nan"), "loss": loss / n if n else float("nan")}
    if dv is not None:
        out.update(draft_vocab_acceptance=correct_dv / n if n else float("nan"),
                   draft_vocab_coverage=covered / n if n else float("nan"))
    return out


def _pool(evals: list[dict]) -> dict:
    """evaluate() results over disjoint row sets → the figures over their union (row-weighted)."""
    n = sum(e["rows"] for e in evals)
    out = {"rows": n}
    for k in evals[0]:
        if k != "rows":
            out[k] = sum(e[k] * e["rows"] for e in evals if e["rows"]) / n if n else float("nan")
    return out


def _atomic_torch_save(torch, obj, path: Path) -> None:
    with atomic_path(path, "the checkpoint") as tmp:
        torch.save(obj, tmp)


def train_mtp(
    model_path: str | os.PathLike | None,
    out_path: str | os.PathLike,
    *,
    steps: int = DEFAULT_STEPS,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    gen_tokens: int = DEFAULT_GEN_TOKENS,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch: int = DEFAULT_BATCH,
    lr: float = DEFAULT_LR,
    seed: int = DEFAULT_SEED,
    threads: int | None = None,
    resume: bool = True,
    progress: bool = True,
    ckpt_every: int = 50,
    stop_after: int | None = None,
) -> dict:
    """Train an MTP head for the base `model_path` (a GGUF path or tag), write it to `out_path` (GGUF) and return
    a summary (held-out acceptance, rows, phase times...). Checkpoints go to `<out_path>.ckpt/`; with `resume`
    a run of the same configuration continues from there (teacher data and training state). `stop_after`
    (tests) stops after that many steps of this call, checkpointed, without writing the head."""
    from .gguf import GGUFFile
    from .models import load_model
    from .run import set_threads
    from .tokenizer import Tokenizer
    from .upcycle import resolve_model

    t_start = time.perf_counter()
    for flag, v, lo in (("--steps", steps, 1), ("--text-tokens", text_tokens, 0), ("--gen-tokens", gen_tokens, 0),
                        ("--seq-len", seq_len, 16), ("--batch", batch, 1), ("--seed", seed, 0)):
        if int(v) != v or v < lo:
            raise TrainMtpError(f"{flag} must be an integer >= {lo}, got {v}")
    if text_tokens + gen_tokens < 64:
        raise TrainMtpError("--text-tokens + --gen-tokens must be at least 64")
    if not (lr > 0 and math.isfinite(lr)):
        raise TrainMtpError(f"--lr must be a positive number, got {lr}")
    if ckpt_every < 1:
        raise TrainMtpError(f"ckpt_every must be >= 1, got {ckpt_every}")
    out_path = Path(out_path)
    if out_path.is_dir():
        raise TrainMtpError(f"-o {out_path}: is a directory")
    if not out_path.parent.is_dir():
        raise TrainMtpError(f"-o {out_path}: the directory {out_path.parent} does not exist")
    torch = _torch()
    n_threads = set_threads(threads)
    torch.set_num_threads(n_threads)

    bars = _Bars(progress)
    phases: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        path = resolve_model(model_path, progress=progress)
        if out_path.exists() and out_path.resolve() == Path(path).resolve():
            raise TrainMtpError(f"-o {out_path}: would overwrite the base model")
        g = GGUFFile(path)
        if g.architecture not in SUPPORTED_ARCHS:
            raise UnsupportedArchitectureError(
                f"{g.path}: train-mtp supports architectures {', '.join(SUPPORTED_ARCHS)}, not '{g.architecture}'")
        model = load_model(g)
        args = model.args
        if seq_len > args.context_length:
            raise TrainMtpError(f"--seq-len {seq_len} exceeds the model's context length {args.context_length}")
        tok = Tokenizer.from_metadata(g.metadata)
        cfg = TrainConfig(g.identity_digest(), int(text_tokens), int(gen_tokens), int(seq_len), int(seed),
                          int(steps), int(batch), float(lr))
        ckpt = Path(f"{out_path}.ckpt")
        if not resume and ckpt.exists():
            import shutil

            shutil.rmtree(ckpt)
        (ckpt / "data").mkdir(parents=True, exist_ok=True)
        phases["load"] = time.perf_counter() - t0

        # -- teacher data ------------------------------------------------------------------------------
        parts = []
        for name, budget in (("text", text_tokens), ("gen", gen_tokens)):
            t0 = time.perf_counter()
            f = ckpt / "data" / f"{name}.npz"
            part = _load_npz(f, cfg.data_key(name)) if resume else None
            if part is not None:
                bars.log(f"{name} teacher data: reusing {f} ({part['lens'].size} chunks, {part['tokens'].size} rows)")
            else:
                if name == "text":
                    docs = text_documents(tok, budget, seed, seq_len) if budget else []
                else:
                    docs = []
                    if budget:
                        adv = bars.bar("generating (base, greedy)", budget, "tokens")
                        docs = generate_documents(model, tok, budget, seed, min(args.context_length, 4 * seq_len),
                                                  adv)
                n_rows = sum(len(ids) for _, ids in docs)
                adv = bars.bar(f"teacher pass ({name})", n_rows, "rows") if n_rows else (lambda n=1, **kw: None)
                part = teacher_pass(model, docs, seq_len, adv)
                _save_npz(f, part, cfg.data_key(name))
            phases[f"data_{name}"] = time.perf_counter() - t0
            parts.append(part)
        ds = Dataset.join(parts)
        train_chunks, held_chunks = ds.split(seed)
        train_rows, held_rows = ds.rows(train_chunks), ds.rows(held_chunks)
        # draft vocabulary: the most frequent targets of the training rows, most frequent first (ties: lower id)
        tmask = np.zeros(ds.tokens.size, bool)
        for c in train_chunks:
            tmask[ds.starts[c] + 1 : ds.starts[c] + ds.lens[c]] = True
        counts = np.bincount(ds.greedy[tmask], minlength=args.vocab_size)[: args.vocab_size]
        draft_vocab = np.argsort(-counts, kind="stable")[: min(DRAFT_VOCAB, args.vocab_size)].astype(np.int32)
        bars.log(f"teacher data: {len(np.unique(ds.groups))} document groups, {train_rows} training rows, "
                 f"{held_rows} held-out rows")

        # -- model -------------------------------------------------------------------------------------
        t0 = time.perf_counter()
        from .gguf import f32

        block, qtypes = base_block(g, args)
        out_norm = np.array(f32(g.tensor("output_norm.weight")), np.float32)
        emb = torch.from_numpy(np.array(f32(g.tensor("token_embd.weight")), np.float32))
        lm_head = emb if not g.has("output.weight") else torch.from_numpy(
            np.array(f32(g.tensor("output.weight")), np.float32))
        torch.manual_seed(seed)
        hidden_scale = float(np.median(ds.rms[tmask])) if tmask.any() else 1.0
        head = build_head(torch, args, block, out_norm, seq_len, seed, hidden_scale=hidden_scale, qtypes=qtypes)
        params = [p for p in head.parameters()]
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        ce = _lm_head_ce(torch)
        step, history, step0 = 0, [], None
        state_file = ckpt / "state.pt"
        if resume and state_file.is_file():
            st = torch.load(state_file, map_location="cpu", weights_only=False)
            if st.get("config") == cfg.as_dict():
                head.load_state_dict(st["params"])
                opt.load_state_dict(st["optim"])
                torch.set_rng_state(st["torch_rng"])
                step, history, step0 = int(st["step"]), list(st["history"]), st.get("step0")
                bars.log(f"resuming from {state_file} at step {step}/{steps}")
            else:
                diff = [k for k, v in cfg.as_dict().items() if st.get("config", {}).get(k) != v]
                bars.log(f"{state_file}: another configuration ({', '.join(diff)} differ): training starts over")
        phases["init"] = time.perf_counter() - t0

        def save() -> None:
            _atomic_torch_save(torch, {"config": cfg.as_dict(), "step": step, "params": head.state_dict(),
                                       "optim": opt.state_dict(), "torch_rng": torch.get_rng_state(),
                                       "history": history, "step0": step0}, state_file)

        t0 = time.perf_counter()
        if step0 is None:
            head.eval()
            step0 = evaluate(torch, head, emb, lm_head, ds, held_chunks)
            bars.log(f"step 0: held-out acceptance {step0['acceptance']:.3f}, loss {step0['loss']:.3f}")
        phases["eval"] = time.perf_counter() - t0

        # -- training ----------------------------------------------------------------------------------
        t0 = time.perf_counter()
        head.train()
        adv = bars.bar("training the MTP head", steps, "steps")
        adv(step)
        ema = None
        done_here = 0
        consistent = True  # the parameters are those of `step` (not inside an optimizer update)
        try:
            while step < steps and (stop_after is None or done_here < stop_after):
                hn, nxt, tgt, valid = ds.batch(_batch_chunks(train_chunks, batch, seed, step))
                m = torch.from_numpy(valid)
                for group in opt.param_groups:
                    group["lr"] = _lr_at(step, steps, lr)
                y = head(torch.from_numpy(hn), emb[torch.from_numpy(nxt)])[m]
                t = torch.from_numpy(tgt)[m]
                loss, pred = ce(y, lm_head, t)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                consistent = False
                opt.step()
                history.append((step, float(loss.detach()), float((pred == t).float().mean())))
                step += 1
                done_here += 1
                consistent = True
                ema = history[-1][2] if ema is None else 0.9 * ema + 0.1 * history[-1][2]
                adv(1, loss=f"{history[-1][1]:.3f}", acc=f"{ema:.3f}")
                if step % ckpt_every == 0 or step == steps:
                    save()
        except KeyboardInterrupt:
            if consistent and done_here:
                save()
                bars.close()
                bars.log(f"interrupted: checkpoint at step {step} in {state_file}; run again to resume")
            raise
        if done_here and step % ckpt_every and step != steps:
            save()
        phases["train"] = time.perf_counter() - t0
        if step < steps:  # stopped early (stop_after): checkpointed, nothing written
            bars.close()
            return {"stopped_at": step, "steps": steps, "history": history, "phases": phases}

        # -- export and final evaluation ---------------------------------------------------------------
        t0 = time.perf_counter()
        head.eval()
        values = {k: v.detach().numpy().copy() for k, v in head.p.items()}
        tensors = export_tensors(values, qtypes)
        shapes = {gguf_name(k): v.shape for k, v in values.items()}
        written = dequantized(tensors, shapes)
        float_eval = evaluate(torch, head, emb, lm_head, ds, held_chunks, draft_vocab)
        with torch.no_grad():
            for k, p in head.p.items():
                p.copy_(torch.from_numpy(written[gguf_name(k)]))
        by_source = {name: evaluate(torch, head, emb, lm_head, ds, held_chunks[ds.sources[held_chunks] == i],
                                    draft_vocab) for i, name in enumerate(("text", "gen"))}
        file_eval = _pool(list(by_source.values()))
        phases["eval"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        tensors.append(("mtp.draft_vocab", draft_vocab, "I32"))
        seconds = time.perf_counter() - t_start
        meta = {
            "guild.mtp.base_architecture": args.arch,
            "guild.mtp.base_digest": cfg.base_digest,
            "guild.mtp.base_name": Path(path).name,
            "guild.mtp.ffn": "moe" if args.is_moe else "dense",
            "guild.mtp.train.sources": SOURCES,
            "guild.mtp.train.rows": int(train_rows),
            "guild.mtp.train.heldout_rows": int(held_rows),
            "guild.mtp.train.steps": int(steps),
            "guild.mtp.train.seq_len": int(seq_len),
            "guild.mtp.train.hidden_scale": float(hidden_scale),
            "guild.mtp.train.heldout_acceptance": float(file_eval["acceptance"]),
            "guild.mtp.train.heldout_acceptance_step0": float(step0["acceptance"]),
            "guild.mtp.train.seconds": float(seconds),
        }
        size = write_head_gguf(out_path, tensors, meta)
        phases["export"] = time.perf_counter() - t0
        bars.close()
        losses = [h[1] for h in history]
        k = max(1, min(10, len(losses) // 5))
        summary = {
            "output": str(out_path),
            "bytes": size,
            "base": str(path),
            "base_digest": cfg.base_digest,
            "document_groups": int(len(np.unique(ds.groups))),
            "rows": train_rows,
            "heldout_rows": held_rows,
            "steps": steps,
            "heldout_acceptance": file_eval["acceptance"],
            "heldout_acceptance_float": float_eval["acceptance"],
            "heldout_acceptance_step0": step0["acceptance"],
            "heldout_acceptance_text": by_source["text"]["acceptance"],
            "heldout_acceptance_gen": by_source["gen"]["acceptance"],
            "heldout_loss": file_eval["loss"],
            "heldout_loss_step0": step0["loss"],
            "draft_vocab_size": int(draft_vocab.size),
            "draft_vocab_acceptance": file_eval["draft_vocab_acceptance"],
            "draft_vocab_coverage": file_eval["draft_vocab_coverage"],
            "train_loss_first": float(np.mean(losses[:k])) if losses else None,
            "train_loss_last": float(np.mean(losses[-k:])) if losses else None,
            "threads": n_threads,
            "seconds": time.perf_counter() - t_start,
            "phases": {k: round(v, 2) for k, v in phases.items()},
            "sources": SOURCES,
            "history": history,
        }
        bars.log("phase times: " + " · ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in summary.items()}
    finally:
        bars.close()
