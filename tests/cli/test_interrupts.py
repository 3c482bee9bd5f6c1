"""Ctrl-C: in a non-interactive `guild run` (a child process: exit status 130, one line on stderr, the text
streamed so far kept on stdout) and a second Ctrl-C during a chat reply (the turn is dropped, the cache rebuilt,
the chat goes on and ends with status 0)."""

import io
import os
import signal
import subprocess
import sys

from guild.cli.repl import ChatRepl
from guild.cli.run import Runner
from guild.engine.options import DecodeOptions
from guild.engine.session import GuildSession
from guild.text.tokenizer import Tokenizer

PROMPT = "Count from one to one thousand:"


def test_sigint_mid_generation_exits_130_with_one_line(dense_model, dense_path):
    p = subprocess.Popen([sys.executable, "-m", "guild", "run", "smollm2-135m", "-p", PROMPT, "-n", "2000",
                          "--ignore-eos", "-t", "1", "--device", "cpu", "--decode-strategy", "normal"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = b""
        while len(seen) < 24:  # generation is under way: some text has been streamed
            chunk = os.read(p.stdout.fileno(), 256)
            assert chunk, p.stderr.read().decode()[-2000:]
            seen += chunk
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130
    assert err.decode() == "error: interrupted\n"  # one line: no traceback, no stats
    # what was streamed stays: the greedy text up to the interrupt, a prefix of the library's own stream
    out = (seen + rest).decode()
    tok = Tokenizer.from_gguf(dense_path)
    ids, _ = GuildSession(dense_model, n_ctx=256).generate(tok.encode(PROMPT), len(tok.encode(out)) + 4)
    full = tok.decode(ids)
    assert full.startswith(out) and len(out) < len(full)


class _InterruptedTwice(io.StringIO):
    """The terminal of a user who presses Ctrl-C twice while the first reply streams: the first SIGINT asks the
    reply to stop, the second (its handler runs as soon as kill returns) raises KeyboardInterrupt mid-window."""

    def __init__(self):
        super().__init__()
        self.sent = False

    def write(self, s):
        if s.strip() and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(s)


def test_second_ctrl_c_in_chat_drops_the_turn_and_chat_goes_on():
    runner = Runner("smollm2-135m", DecodeOptions(max_tokens=24, device="cpu"), threads=1)
    notes, errors, turns = [], [], []
    repl = ChatRepl(runner, note=notes.append, after_turn=turns.append, error=errors.append, out=_InterruptedTwice(),
                    stdin=io.StringIO("Count from one to one hundred in words.\nName a colour.\n"))
    assert repl.loop() == 0 and not errors
    assert "reply stopped (the cache is rebuilt at the next turn)" in notes
    # the interrupted turn left nothing: the history holds the second turn only, and its reply is the one a
    # fresh chat gives (a cache holding half a window, or the dropped message, would change it)
    assert [m["role"] for m in runner.conversation.messages] == ["user", "assistant"] and len(turns) == 1
    got = turns[0].tokens
    runner.conversation.clear()
    runner.session.rewind(0)
    assert runner.say("Name a colour.").tokens == got
