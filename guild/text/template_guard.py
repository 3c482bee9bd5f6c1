"""Chat templates are code from the model file: rendered in Jinja's immutable sandbox with limits on time,
output size, call depth, memory growth and the size of any one value an operator or filter makes. Jinja's
sandbox itself bounds `range` and refuses unsafe attributes; these limits are the rest
(jinja.palletsprojects.com/en/stable/sandbox/#operator-intercepting for the operator hooks)."""

from __future__ import annotations

import gc
import re
import sys
import time
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ChatTemplateError

TIME_LIMIT_S = 5.0  # of the rendering thread's CPU time: real chat templates render in milliseconds
MAX_OUTPUT = 4 * 2**20  # characters of rendered prompt (well past any context window)
MAX_VALUE = MAX_OUTPUT  # length of one string/list an operator, filter or method call may build
MAX_DEPTH = 200  # nested Python frames under render (macro recursion, recursive loops)
MAX_GROWTH = 256 * 2**20  # resident memory the render may add
MAX_POW_BITS = 4096
_WIDTH = re.compile(r"%[-+ #0]*(\d{7,})|\{[^}]*?(\d{7,})[^}]*\}")


class TemplateLimit(ChatTemplateError):
    pass


_GUILD = str(Path(__file__).resolve().parents[1])
_JINJA = str(Path(jinja2.__file__).resolve().parent)


def raised_by_guild(e: BaseException) -> bool:
    """Whether `e` is guild's own fault rather than the template's: the innermost frame that is guild's, Jinja's or
    the compiled template's ("<template>") is guild's (a filter or guard that failed, or passed the standard
    library something it refused). A template's own errors surface in the template or in Jinja; running out of
    stack or memory is the template's too."""
    if isinstance(e, (RecursionError, MemoryError)):
        return False
    tb, frames = e.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    for f in reversed(frames):
        if f == "<template>" or f.startswith(_JINJA):
            return False
        if f.startswith(_GUILD):
            return True
    return False


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return 0


def _size(x) -> int:
    try:
        return len(x) if isinstance(x, (str, bytes, list, tuple, dict)) else 0
    except TypeError:
        return 0


def _check_args(args, kwargs, what: str) -> None:
    """Width/count arguments (center, indent, ljust, zfill, wordwrap, tojson indent, lipsum...) and format
    strings with huge widths would build huge values in one C call: refuse them before the call."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_VALUE:
            raise TemplateLimit(f"tokenizer.chat_template: {what} argument {a} is over the limit {MAX_VALUE}")
        if isinstance(a, str) and ("%" in a or "{" in a) and _WIDTH.search(a):
            raise TemplateLimit(f"tokenizer.chat_template: {what}: format width over the limit")


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "%", "+", "//", "/"])

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            n = right if isinstance(right, int) else left if isinstance(left, int) else None
            seq = left if isinstance(right, int) else right
            if n is not None and not isinstance(n, bool) and _size(seq) * max(n, 0) > MAX_VALUE:
                raise TemplateLimit(f"tokenizer.chat_template: '*' would build {_size(seq) * n} items "
                                    f"(limit {MAX_VALUE})")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and \
                    abs(left).bit_length() * right > MAX_POW_BITS:
                raise TemplateLimit("tokenizer.chat_template: '**' result too large")
        elif operator == "%" and isinstance(left, str):
            _check_args((left,), {}, "'%'")
        elif operator == "+" and _size(left) + _size(right) > MAX_VALUE:
            raise TemplateLimit("tokenizer.chat_template: '+' result over the size limit")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's signature
        _check_args(args, kwargs, getattr(__obj, "__name__", "call"))
        if getattr(__obj, "__name__", "") == "format" and isinstance(getattr(__obj, "__self__", None), str):
            _check_args((__obj.__self__,), {}, "format")
        return super().call(__context, __obj, *args, **kwargs)


def guard_filters(env) -> None:
    """Every filter and global function checked like a call (filters do not go through `call`)."""
    def wrap(name, f):
        if getattr(f, "jinja_pass_arg", None) is not None:  # context/environment filters: keep the marker
            def g(first, *args, **kwargs):
                _check_args(args, kwargs, name)
                return f(first, *args, **kwargs)
        else:
            def g(*args, **kwargs):
                _check_args(args[1:], kwargs, name)
                return f(*args, **kwargs)
        g.__dict__.update(getattr(f, "__dict__", {}))
        g.__name__ = name
        return g

    for k, f in list(env.filters.items()):
        env.filters[k] = wrap(k, f)
    for k in ("lipsum", "range"):
        if k in env.globals:
            env.globals[k] = _checked_global(k, env.globals[k])


def _checked_global(name, f):
    def g(*args, **kwargs):
        _check_args(args, kwargs, name)
        return f(*args, **kwargs)

    return g


def render(template, variables: dict) -> str:
    """template.generate with the limits; a limit hit or any exception in the template is a ChatTemplateError."""
    # the thread's CPU time, not the wall clock: a template loops on its own thread, while time spent waiting for
    # the GIL or a core (another thread running a kernel, a busy machine) is not the template's
    deadline = time.thread_time() + TIME_LIMIT_S
    rss0 = _rss()
    depth = [0]
    ticks = [0]

    def check():
        ticks[0] += 1
        if time.thread_time() > deadline:
            raise TemplateLimit(f"tokenizer.chat_template: rendering took over {TIME_LIMIT_S:g} s of CPU time")
        if rss0 and ticks[0] % 16 == 0 and _rss() - rss0 > MAX_GROWTH:  # a /proc read: not every line
            raise TemplateLimit(f"tokenizer.chat_template: rendering used over {MAX_GROWTH >> 20} MiB")

    def local(frame, event, arg):
        if event == "line":
            check()
        elif event == "return":
            depth[0] -= 1
        return local

    def tracer(frame, event, arg):
        if event == "call":
            depth[0] += 1
            if depth[0] > MAX_DEPTH:
                raise TemplateLimit(f"tokenizer.chat_template: calls nested over {MAX_DEPTH} deep")
            return local
        return None

    old = sys.gettrace()
    out, n = [], 0
    gc_was = gc.isenabled()
    gc.disable()  # a collection walks the whole process's objects: not the template's time (its memory: the RSS check)
    sys.settrace(tracer)
    try:
        for chunk in template.generate(**variables):
            n += len(chunk)
            if n > MAX_OUTPUT:
                raise TemplateLimit(f"tokenizer.chat_template: output over {MAX_OUTPUT} characters")
            out.append(chunk)
            check()
    finally:
        sys.settrace(old)
        if gc_was:
            gc.enable()
    text = "".join(out)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ChatTemplateError("tokenizer.chat_template: rendered text is not valid Unicode (lone surrogates)") \
            from None
    return text
