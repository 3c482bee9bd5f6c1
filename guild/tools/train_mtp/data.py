"""train-mtp's training documents: stdlib sources and pydoc topics (text), the base's greedy chat generations on
the prompts written here (generations)."""

from __future__ import annotations

import math
import sysconfig
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import numpy as np

from ...engine.session import GuildSession, generate_concurrent
from ...errors import ContextOverflowError, GuildError
from ...text.chat import Conversation
from .config import EXCLUDED_STDLIB, EXCLUDED_TOPICS, GEN_BATCH, GEN_MAX_TOKENS

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

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts) and p.name not in
             EXCLUDED_STDLIB]
    return sorted(files, key=lambda p: str(p.relative_to(root)))


def _topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics  # absent from some Python builds
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
                try:
                    ids = convs[j].prepare(turns[turn], drop_oldest=False)  # a training text keeps its turns
                except ContextOverflowError:
                    continue  # would not fit: the conversation ends here
                if convs[j].session.state.pos + len(ids) + max_new >= n_ctx:
                    continue
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
