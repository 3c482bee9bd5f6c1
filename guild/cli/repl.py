"""The interactive chat (`guild run -i`, `guild chat`): line editing and history (GNU readline; the history file
in the user data directory), slash commands, Ctrl-C that stops a reply rather than the program, and a context that
drops its oldest turns when full (guild.text.chat.Conversation) instead of ending the session.

Keys: Ctrl-C during a reply stops it and returns to the prompt (a second Ctrl-C in the same reply stops at once
and rebuilds the cache); Ctrl-C or Ctrl-D at an empty prompt ends the chat (exit status 0); Ctrl-C on a line
being typed clears it."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import BadFlagError, GuildError
from ..formats.files import write_bytes
from ..text.inputs import conversation_messages, prompt_text

HELP = """\
/help             this list
/clear            forget the conversation (the system prompt stays)
/system [TEXT]    set the system prompt; without TEXT show it; /system - removes it
/save FILE        write the conversation as JSON (role/content; --conversation and /load read it)
/load FILE        replace the conversation with one from a JSON/YAML file
/bye, /exit       end the chat (so do Ctrl-D, and Ctrl-C at an empty prompt)
Ctrl-C during a reply stops it. \"\"\" begins and ends a message of several lines. Up/down: history."""

HISTORY_LENGTH = 1000
MULTILINE = '"""'


def history_path() -> Path:
    """The chat's line history: GUILD_HISTORY_FILE, else chat_history in the user data directory."""
    env = os.environ.get("GUILD_HISTORY_FILE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("guild")) / "chat_history"


class _Readline:
    """GNU readline when stdin is a terminal: editing keys, history (loaded now, saved at the end)."""

    def __init__(self, interactive: bool):
        self.rl, self.path = None, None
        if not interactive:
            return
        try:
            import readline
        except ImportError:  # pragma: no cover - Python built without readline: plain input()
            return
        self.rl, self.path = readline, history_path()
        readline.set_history_length(HISTORY_LENGTH)
        try:
            readline.read_history_file(self.path)
        except (OSError, ValueError):
            pass

    def line_buffer(self) -> str:
        return self.rl.get_line_buffer() if self.rl is not None else ""

    def save(self) -> str | None:
        """Write the history; returns why it could not be written (or None)."""
        if self.rl is None:
            return None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.rl.write_history_file(self.path)
        except OSError as e:
            return f"history {self.path}: not saved ({e.strerror or e})"
        return None


class _ReplyInterrupt:
    """SIGINT during a reply: the first asks the generation to stop at its next token (`__call__` is the turn's
    cancel); a second raises KeyboardInterrupt at once."""

    def __init__(self):
        self.hits = 0

    def _handler(self, signum, frame):
        self.hits += 1
        if self.hits > 1:
            raise KeyboardInterrupt

    def __enter__(self):
        self.old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.old)
        return False

    def __call__(self) -> bool:
        return self.hits > 0


class ChatRepl:
    """Reads lines, runs them as chat turns on `runner` (guild.cli.run.Runner), streams replies to `out`; `note`
    gets what goes to stderr (notes, errors); `after_turn(turn)` prints stats or a JSON line; `stream=False`
    (--json) prints no text."""

    def __init__(self, runner, *, note: Callable[[str], None], after_turn: Callable[[object], None],
                 error: Callable[[str], None], stream: bool = True, out=None, stdin=None):
        self.runner, self.conv = runner, runner.conversation
        self.note, self.after_turn, self.error, self.stream = note, after_turn, error, stream
        self.out = out or sys.stdout
        self.stdin = stdin or sys.stdin
        self.tty = self.stdin.isatty()
        self.conv.on_drop = lambda n, kept, n_ctx: self._drop_note(n, kept, n_ctx)

    def _drop_note(self, n: int, kept: int, n_ctx: int) -> None:
        from ..text.chat import drop_note

        self.note(drop_note(n, kept, n_ctx))

    # -- input --------------------------------------------------------------------------------------------
    def _input(self, prompt: str) -> str:
        if self.tty:
            return input(prompt)
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def read_message(self, rl: _Readline) -> str | None:
        """The next message (None: end of the chat). Ctrl-C at an empty prompt ends it; on a line being
        typed it clears the line."""
        typed = []

        def on_sigint(signum, frame):  # runs inside readline's loop, while the typed line is still its buffer
            typed.append(rl.line_buffer())
            raise KeyboardInterrupt

        while True:
            typed.clear()
            old = signal.signal(signal.SIGINT, on_sigint)
            try:
                line = self._input(">>> " if self.tty else "")
            except EOFError:
                return None
            except KeyboardInterrupt:
                if any(typed):
                    self.out.write("\n")
                    continue
                return None
            finally:
                signal.signal(signal.SIGINT, old)
            if line.lstrip().startswith(MULTILINE):
                line = self._multiline(line.lstrip()[len(MULTILINE):])
                if line is None:
                    return None
            return line

    def _multiline(self, first: str) -> str | None:
        if first.rstrip().endswith(MULTILINE):
            return first.rstrip()[: -len(MULTILINE)]
        lines = [first]
        while True:
            try:
                line = self._input("... " if self.tty else "")
            except (EOFError, KeyboardInterrupt):
                return None
            if line.rstrip().endswith(MULTILINE):
                lines.append(line.rstrip()[: -len(MULTILINE)])
                return "\n".join(lines).strip("\n")
            lines.append(line)

    # -- the loop -----------------------------------------------------------------------------------------
    def loop(self) -> int:
        """Run until /bye, Ctrl-D or Ctrl-C at an empty prompt; returns the exit status (0)."""
        rl = _Readline(self.tty)
        if self.tty:
            self.note("chat: /help for commands · Ctrl-C stops a reply · Ctrl-D or /bye ends")
        try:
            while True:
                line = self.read_message(rl)
                if line is None:
                    break
                text = prompt_text(line, "stdin", replace=True)
                if not text.strip():
                    continue  # an empty line does nothing
                if text.startswith("/") and not text.startswith("//"):
                    if self.command(text) == "quit":
                        break
                    continue
                self.turn(text[1:] if text.startswith("//") else text)
        finally:
            if self.tty:
                self.out.write("\n")
                self.out.flush()
            why = rl.save()
            if why:
                self.note(why)
        return 0

    def turn(self, text: str) -> None:
        def show(s: str) -> None:
            self.out.write(s)
            self.out.flush()

        try:
            with _ReplyInterrupt() as stop:
                t = self.runner.say(text, show if self.stream else None, cancel=stop)
        except KeyboardInterrupt:  # a second Ctrl-C: the cache may hold half a window; rebuild it next turn
            self.runner.session.rewind(0)
            if self.conv.messages and self.conv.messages[-1]["role"] == "user":
                self.conv.messages = self.conv.messages[:-1]
            self.out.write("\n")
            self.note("reply stopped (the cache is rebuilt at the next turn)")
            return
        except GuildError as e:
            self.error(str(e))
            return
        if self.stream:
            self.out.write("\n")
            self.out.flush()
        if t.stats.stop_reason == "interrupted":
            self.note("reply stopped")
        self.after_turn(t)

    def command(self, text: str) -> str | None:
        name, _, arg = text.partition(" ")
        arg = arg.strip()
        try:
            if name in ("/bye", "/exit", "/quit"):
                return "quit"
            if name in ("/help", "/?"):
                self.note(HELP)
            elif name == "/clear":
                self.conv.clear()
                self.note("conversation cleared" + (" (system prompt kept)" if self.conv.system else ""))
            elif name == "/system":
                if not arg:
                    self.note(f"system prompt: {self.conv.system}" if self.conv.system else "no system prompt")
                else:
                    self.conv.system = None if arg == "-" else arg
                    self.note("system prompt removed" if arg == "-" else "system prompt set")
            elif name == "/save":
                if not arg:
                    raise BadFlagError("/save needs a file name")
                data = json.dumps(self.conv.messages, ensure_ascii=False, indent=1) + "\n"
                write_bytes(arg, data.encode(), "/save")
                self.note(f"saved {len(self.conv.messages)} messages to {arg}")
            elif name == "/load":
                if not arg:
                    raise BadFlagError("/load needs a file name")
                msgs = conversation_messages(arg, "/load")
                self.conv.load(msgs)
                self.note(f"loaded {len(msgs)} messages from {arg}")
            else:
                raise BadFlagError(f"unknown command {name} (/help lists them; // sends a line starting with /)")
        except GuildError as e:
            self.error(str(e))
        except OSError as e:
            self.error(f"{name} {arg}: {e.strerror or e}")
        return None
