"""What the text around the tokens looks like (TextOptions: system prompt, stop strings, end-of-generation,
chat template, the grammar a reply follows), each setting validated once with the flag's name in the message.
Light on purpose: the grammar compiles only when asked."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadFlagError


@dataclass(frozen=True)
class TextOptions:
    """What the text around the tokens looks like: `--system`, `--stop`, `--ignore-eos`, `--chat-template`, and the
    grammar it follows: `--json-schema` or `--grammar` (files)."""

    system: str | None = None  # the system prompt of a chat
    stop: tuple[str, ...] = ()  # the text ends just before the first of these (never shown)
    ignore_eos: bool = False  # generate past end-of-generation tokens (they are not shown)
    chat_template: str | None = None  # a Jinja file replacing the GGUF's tokenizer.chat_template
    json_schema: str | None = None  # a JSON schema file
    grammar: str | None = None  # an llguidance Lark grammar file

    def __post_init__(self):
        if any(not s for s in self.stop):
            raise BadFlagError("--stop: an empty stop string would stop at once")
        if self.json_schema is not None and self.grammar is not None:
            raise BadFlagError("--json-schema and --grammar cannot both constrain one reply; give one")

    def compile(self, tok):
        """The grammar of --json-schema / --grammar for this tokenizer (None without either); tok None checks the
        file as far as it can be without a vocabulary."""
        from ..text.grammar import MAX_GRAMMAR_CHARS, compile_grammar
        from ..text.inputs import read_text_file

        for flag, path, kind in (("--json-schema", self.json_schema, "json_schema"),
                                 ("--grammar", self.grammar, "lark")):
            if path is not None:
                src = read_text_file(path, flag, MAX_GRAMMAR_CHARS)
                return compile_grammar(kind, src, tok, f"{flag} {path}")
        return None
