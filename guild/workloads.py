"""Benchmark workloads W1–W11 (README "Benchmarks").

One YAML file per workload, ``workloads/W<n>.yaml`` next to the ``guild/`` package; long texts live in
``workloads/texts/<NAME>.txt`` and are copied into the repository, so a bench reads nothing else at run time.

Schema (keys other than these are refused)::

    id: W2                      # required; equals the file name without .yaml
    name: summarisation         # required; short name
    description: one line       # required
    source: where the texts come from, with their license     # required
    chat: true                  # optional (default true): render turns with the model's chat template
    turns:                      # required, non-empty: the user messages, in order (several = multi-turn)
      - "Summarise ...\\n\\n{text:python_history}"   # {text:NAME} inserts workloads/texts/NAME.txt
    max_tokens: 128             # required: tokens generated per turn at most (>= 1)
    sampling: {temperature: 0}  # optional (default greedy): temperature, top_k, top_p, min_p, repeat_penalty,
                                #   frequency_penalty, presence_penalty, penalty_last_n, seed (SamplingParams)
    corpus: [python_history]    # optional: texts the retrieval drafter ingests
    context_sizes: [512, 1024]  # optional, W10: the prompt is cut to about this many tokens each (increasing);
                                #   the turns must reference exactly one text, the document that is cut
    speculation: friendly       # optional (default friendly): friendly | hostile, what the seed expects
    json_schema: ticket_schema  # optional: a text holding a JSON schema every reply follows (constrained decoding)

A text is inserted without its trailing whitespace; ``{text:NAME}`` is the only substitution (other braces,
e.g. a JSON schema's, are left alone). Errors are ``WorkloadError`` (a ``GuildError``) naming file and field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from .engine.sampling import SamplingParams
from .errors import GuildError

TEXT_REF = re.compile(r"\{text:([^{}]*)\}")
TEXT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
SPECULATION = ("friendly", "hostile")
REQUIRED = ("id", "name", "description", "source", "turns", "max_tokens")
OPTIONAL = ("chat", "sampling", "corpus", "context_sizes", "speculation", "json_schema")
SAMPLING_KEYS = {
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "repeat_penalty": float,
    "frequency_penalty": float,
    "presence_penalty": float,
    "penalty_last_n": int,
    "seed": int,
}


class WorkloadError(GuildError):
    """A workload file is missing, malformed, or references a text that does not exist."""


def default_root() -> Path:
    """The repository's ``workloads/`` folder (``guild/`` sits next to it)."""
    return Path(__file__).resolve().parents[1] / "workloads"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Workload:
    """One benchmark workload, validated on construction (see the module docstring for the fields)."""

    id: str
    name: str
    description: str
    source: str
    turns: tuple[str, ...]
    max_tokens: int
    chat: bool = True
    sampling: Mapping[str, Any] = field(default_factory=dict, hash=False)
    corpus: tuple[str, ...] = ()
    context_sizes: tuple[int, ...] = ()
    speculation: str = "friendly"
    json_schema: str | None = None
    # Not YAML keys: the referenced texts (NAME -> content), the file it came from, the size it was scaled to.
    texts: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    path: Path | None = field(default=None, compare=False, repr=False)
    size: int | None = None

    # -- validation --------------------------------------------------------------------------------
    def _fail(self, fld: str, why: str) -> WorkloadError:
        where = str(self.path) if self.path is not None else f"workload {self.id!r}"
        return WorkloadError(f"{where}: field '{fld}': {why}")

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for f in ("id", "name", "description", "source"):
            v = getattr(self, f)
            if not isinstance(v, str) or not v.strip():
                raise self._fail(f, f"expected a non-empty string, got {v!r}")
        if not isinstance(self.chat, bool):
            raise self._fail("chat", f"expected true or false, got {self.chat!r}")
        if isinstance(self.turns, str) or not isinstance(self.turns, Sequence) or not self.turns:
            raise self._fail("turns", f"expected a non-empty list of strings, got {self.turns!r}")
        for i, t in enumerate(self.turns):
            if not isinstance(t, str) or not t.strip():
                raise self._fail(f"turns[{i}]", f"expected a non-empty string, got {t!r}")
        set_(self, "turns", tuple(self.turns))
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise self._fail("max_tokens", f"expected an integer >= 1, got {self.max_tokens!r}")
        if self.speculation not in SPECULATION:
            raise self._fail("speculation", f"expected one of {', '.join(SPECULATION)}, got {self.speculation!r}")
        self._check_sampling()
        if isinstance(self.corpus, str) or not isinstance(self.corpus, Sequence):
            raise self._fail("corpus", f"expected a list of text names, got {self.corpus!r}")
        for i, c in enumerate(self.corpus):
            if not isinstance(c, str) or not TEXT_NAME.fullmatch(c):
                raise self._fail(f"corpus[{i}]", f"expected a text name (workloads/texts/NAME.txt), got {c!r}")
        set_(self, "corpus", tuple(self.corpus))
        if not isinstance(self.texts, Mapping):
            raise self._fail("texts", f"expected a mapping NAME -> text, got {type(self.texts).__name__}")
        set_(self, "texts", MappingProxyType(dict(self.texts)))
        for i, t in enumerate(self.turns):
            for name in TEXT_REF.findall(t):
                self._check_text(f"turns[{i}]", name)
        for i, c in enumerate(self.corpus):
            self._check_text(f"corpus[{i}]", c)
        if self.json_schema is not None:
            self._check_text("json_schema", self.json_schema)
        self._check_sizes()
        if self.size is not None and (not _is_int(self.size) or self.size < 1):
            raise self._fail("size", f"expected an integer >= 1, got {self.size!r}")

    def _check_text(self, fld: str, name: str) -> None:
        if not TEXT_NAME.fullmatch(name):
            raise self._fail(fld, f"bad text reference {{text:{name}}} (names: letters, digits, _ . -)")
        if name not in self.texts:
            raise self._fail(fld, f"text '{name}' was not loaded (expected workloads/texts/{name}.txt)")
        if not isinstance(self.texts[name], str):
            raise self._fail(fld, f"text '{name}' is not a string")

    def _check_sampling(self) -> None:
        if self.sampling is None:
            object.__setattr__(self, "sampling", {})
        if not isinstance(self.sampling, Mapping):
            raise self._fail("sampling", f"expected a mapping like {{temperature: 0}}, got {self.sampling!r}")
        for k, v in self.sampling.items():
            if k not in SAMPLING_KEYS:
                raise self._fail(f"sampling.{k}", f"unknown sampling key (known: {', '.join(SAMPLING_KEYS)})")
            kind = SAMPLING_KEYS[k]
            if not (_is_int(v) if kind is int else _is_number(v)):
                raise self._fail(f"sampling.{k}", f"expected {'an integer' if kind is int else 'a number'}, got {v!r}")
        try:
            self.sampling_params()
        except GuildError as e:  # SamplingParams names the CLI flag; say which field it came from
            raise self._fail("sampling", str(e)) from None
        object.__setattr__(self, "sampling", MappingProxyType(dict(self.sampling)))

    def _check_sizes(self) -> None:
        sizes = self.context_sizes
        if sizes is None:
            sizes = ()
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            raise self._fail("context_sizes", f"expected a list of token counts, got {sizes!r}")
        for i, n in enumerate(sizes):
            if not _is_int(n) or n < 1:
                raise self._fail(f"context_sizes[{i}]", f"expected an integer >= 1, got {n!r}")
        if list(sizes) != sorted(set(sizes)):
            raise self._fail("context_sizes", f"expected strictly increasing sizes, got {list(sizes)}")
        object.__setattr__(self, "context_sizes", tuple(sizes))
        if sizes:
            docs = self.document_names()
            if len(docs) != 1:
                raise self._fail(
                    "context_sizes",
                    f"a scaling workload's turns must reference exactly one text (the document), found {docs}",
                )

    # -- loading -----------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, texts_dir: str | Path | None = None) -> Workload:
        """Read and validate one workload file; texts come from ``texts_dir`` (default: ``texts/`` beside it)."""

        path = Path(path)
        texts_dir = Path(texts_dir) if texts_dir is not None else path.parent / "texts"
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as e:
            raise WorkloadError(f"{path}: cannot read workload file ({e.strerror or e})") from None
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            msg = " ".join(str(e).split())
            raise WorkloadError(f"{path}: invalid YAML: {msg}") from None
        if not isinstance(data, dict):
            raise WorkloadError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
        unknown = [k for k in data if k not in REQUIRED + OPTIONAL]
        if unknown:
            raise WorkloadError(
                f"{path}: field '{unknown[0]}': unknown field (known: {', '.join(REQUIRED + OPTIONAL)})"
            )
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise WorkloadError(f"{path}: field '{missing[0]}': required field is missing")
        if isinstance(data["id"], str) and data["id"].lower() != path.stem.lower():
            raise WorkloadError(f"{path}: field 'id': {data['id']!r} does not match the file name {path.name}")

        texts: dict[str, str] = {}
        refs: list[tuple[str, str]] = []
        turns = data["turns"]
        if isinstance(turns, list):
            refs += [(f"turns[{i}]", n) for i, t in enumerate(turns) if isinstance(t, str) for n in TEXT_REF.findall(t)]
        corpus = data.get("corpus") or []
        if isinstance(corpus, list):
            refs += [(f"corpus[{i}]", c) for i, c in enumerate(corpus) if isinstance(c, str)]
        if isinstance(data.get("json_schema"), str):
            refs.append(("json_schema", data["json_schema"]))
        for fld, name in refs:
            if name in texts:
                continue
            if not TEXT_NAME.fullmatch(name):
                raise WorkloadError(f"{path}: field '{fld}': bad text name {name!r} (letters, digits, _ . -)")
            tp = texts_dir / f"{name}.txt"
            try:
                texts[name] = tp.read_text(encoding="utf-8").rstrip()
            except FileNotFoundError:
                raise WorkloadError(f"{path}: field '{fld}': text '{name}' not found ({tp})") from None
            except (OSError, UnicodeDecodeError) as e:
                raise WorkloadError(f"{path}: field '{fld}': cannot read text '{name}' ({tp}: {e})") from None

        kw = {k: data[k] for k in REQUIRED + OPTIONAL if k in data and data[k] is not None}
        return cls(**kw, texts=texts, path=path)

    # -- use ---------------------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """The name in bench tables: ``W2``, or ``W10@1024`` for a scaled instance."""
        return self.id if self.size is None else f"{self.id}@{self.size}"

    def render_turns(self) -> list[str]:
        """The user messages with every ``{text:NAME}`` replaced by the text."""
        return [TEXT_REF.sub(lambda m: self.texts[m.group(1)], t) for t in self.turns]

    def corpus_texts(self) -> list[str]:
        """The texts the retrieval drafter ingests (for a scaled instance: the cut document)."""
        return [self.texts[n] for n in self.corpus]

    def grammar(self, tokenizer):
        """The grammar every reply follows (its `json_schema` compiled for `tokenizer`), or None."""
        if self.json_schema is None:
            return None
        from .text.grammar import compile_grammar  # llguidance, only for a workload that constrains

        return compile_grammar("json_schema", self.texts[self.json_schema], tokenizer, f"{self.id} json_schema")

    def document_names(self) -> list[str]:
        """Distinct texts the turns reference, in order of first use."""
        return list(dict.fromkeys(n for t in self.turns for n in TEXT_REF.findall(t)))

    def sampling_params(self):
        """The workload's sampling as ``guild.engine.sampling.SamplingParams`` (greedy unless it says otherwise)."""

        return SamplingParams(**{k: SAMPLING_KEYS[k](v) for k, v in self.sampling.items()})

    def prompt_ids(self, tokenizer, turn: int = 0) -> list[int]:
        """Token ids of turn ``turn`` alone as the model would see it first in a conversation.

        With ``chat`` and a tokenizer that has ``apply_chat_template``, the templated message (system prompt
        included) with special tokens, as ``guild.text.chat.Conversation`` feeds it; otherwise the plain text.
        """
        return _prompt_ids(tokenizer, self.render_turns()[turn], self.chat)

    def scaled(self, tokenizer, n_tokens: int) -> Workload:
        """A copy whose first prompt is about ``n_tokens`` tokens: the document is cut to fit.

        The document (the one text the turns reference) keeps its first tokens, cut back to a line or word
        boundary; the instructions and the question around it stay whole. Its corpus entry is cut the same way.
        """
        if not self.context_sizes:
            raise self._fail("context_sizes", "not a scaling workload (no context_sizes), cannot scale it")
        if not _is_int(n_tokens) or n_tokens < 1:
            raise self._fail("context_sizes", f"size must be an integer >= 1, got {n_tokens!r}")
        (doc,) = self.document_names()
        text = self.texts[doc]
        turn = next(i for i, t in enumerate(self.turns) if TEXT_REF.search(t))

        def prompt_len(cut: str) -> int:
            sub = TEXT_REF.sub(lambda m: cut if m.group(1) == doc else self.texts[m.group(1)], self.turns[turn])
            return len(_prompt_ids(tokenizer, sub, self.chat))

        overhead = prompt_len("")
        ids = list(tokenizer.encode(text))
        if overhead >= n_tokens:
            raise self._fail(
                "context_sizes",
                f"{n_tokens} tokens leave no room for the document (the prompt around it takes {overhead})",
            )
        if overhead + len(ids) < n_tokens * 0.95:
            raise self._fail(
                "context_sizes", f"text '{doc}' has only {len(ids)} tokens, too short for a {n_tokens}-token prompt"
            )
        budget = n_tokens - overhead
        cut = text
        for _ in range(8):
            cut = _cut_at_boundary(tokenizer.decode(ids[:budget]), text)
            excess = prompt_len(cut) - n_tokens
            if excess <= 0:
                break
            budget -= excess
        return dataclasses.replace(self, texts={**self.texts, doc: cut}, context_sizes=(), size=n_tokens)

    def instances(self, tokenizer, context: int) -> list[Workload]:
        """What a bench runs: the workload itself, or one scaled copy per size that fits in ``context``.

        A size is skipped when it plus ``max_tokens`` exceeds ``context`` (the model's context length).
        """
        if not self.context_sizes:
            return [self]
        return [self.scaled(tokenizer, n) for n in self.context_sizes if n + self.max_tokens <= context]


def _prompt_ids(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and hasattr(tokenizer, "apply_chat_template"):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    try:
        return list(tokenizer.encode(text, add_special=True))
    except TypeError:  # a minimal tokenizer: encode(str) only
        return list(tokenizer.encode(text))


def _cut_at_boundary(prefix: str, full: str) -> str:
    """``prefix`` (a decoded token prefix of ``full``) cut back to the last line break, else the last space,
    when one lies in its final tenth; never a partial character."""
    prefix = prefix.replace("\ufffd", "")
    if len(prefix) >= len(full):
        return full.rstrip()
    for sep in ("\n", " "):
        i = prefix.rfind(sep)
        if i >= len(prefix) * 0.9:
            return prefix[:i].rstrip()
    return prefix.rstrip()


def available(root: str | Path | None = None) -> dict[str, Path]:
    """Workload files under ``root``: id (file stem) -> path, in numeric order (W1, W2, …, W10)."""
    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        raise WorkloadError(f"{root}: workloads folder not found")

    def order(p: Path):
        m = re.fullmatch(r"([A-Za-z]*)(\d+)", p.stem)
        return (m.group(1), int(m.group(2)), "") if m else (p.stem, -1, p.stem)

    return {p.stem: p for p in sorted(root.glob("*.yaml"), key=order)}


def load_workloads(names: Sequence[str] | None = None, root: Path | None = None) -> list[Workload]:
    """Load and validate workloads: all of them, or those named (``"W1"``, ``"w1"``, ``"W1.yaml"``), in order."""
    root = Path(root) if root is not None else default_root()
    files = available(root)
    if not files:
        raise WorkloadError(f"{root}: no workload files (*.yaml)")
    if names is None:
        chosen = list(files)
    else:
        if isinstance(names, str):
            names = [n for n in names.split(",") if n.strip()]
        by_lower = {k.lower(): k for k in files}
        chosen = []
        for n in names:
            k = n.strip()
            k = k[:-5] if k.lower().endswith(".yaml") else k
            if k.lower() not in by_lower:
                raise WorkloadError(f"unknown workload '{n}' (available: {', '.join(files)})")
            chosen.append(by_lower[k.lower()])
        chosen = list(dict.fromkeys(chosen))
    return [Workload.from_file(files[k], root / "texts") for k in chosen]
