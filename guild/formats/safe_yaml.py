"""YAML from files guild did not write (plans copied between machines, conversation files): a size cap, no
aliases (an alias bomb expands kilobytes into gigabytes: en.wikipedia.org/wiki/Billion_laughs_attack), a
nesting limit, and only plain types (str, int, float, bool, null, lists, string-keyed maps) in the result."""

from __future__ import annotations

import yaml

MAX_DEPTH = 32


class UnsafeYaml(ValueError):
    """The document uses something refused here; the message says what."""


class _Loader(yaml.SafeLoader):
    _depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise UnsafeYaml(f"YAML aliases are not accepted (*{ev.anchor}, line {ev.start_mark.line + 1})")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise UnsafeYaml(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _plain(x, where: str = "") -> None:
    stack = [(x, where)]
    while stack:
        v, w = stack.pop()
        if isinstance(v, dict):
            for k, u in v.items():
                if not isinstance(k, str):
                    raise UnsafeYaml(f"{w or 'top level'}: key {k!r} is not a string")
                stack.append((u, f"{w}.{k}" if w else k))
        elif isinstance(v, list):
            stack.extend((u, f"{w}[{i}]") for i, u in enumerate(v))
        elif not (v is None or isinstance(v, (str, int, float, bool))):
            raise UnsafeYaml(f"{w or 'top level'}: {type(v).__name__} values are not accepted")


def load(data: bytes | str):
    """Parse one document; raises UnsafeYaml or yaml.YAMLError (both one line via str(e).splitlines()[0])."""
    try:
        d = yaml.load(data, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except RecursionError:
        raise UnsafeYaml(f"nested deeper than {MAX_DEPTH} levels") from None
    _plain(d)
    return d
