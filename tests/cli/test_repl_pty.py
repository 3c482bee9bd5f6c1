"""The interactive chat driven through a real pseudo-terminal (pexpect), as a user types it: turns, slash
commands, Ctrl-C during a reply and at the prompt, Ctrl-D, and a context that fills up."""

import json
import os
import sys

import pexpect

MODEL = ["smollm2-135m", "-t", "1", "--device", "cpu", "--numerics", "f32"]  # f32: the answers checked below
PROMPT = ">>> "


def _spawn(tmp_path, command, *args):
    env = {**os.environ, "GUILD_HISTORY_FILE": str(tmp_path / "history"), "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "guild", *command, *MODEL, *args], env=env, encoding="utf-8",
                          timeout=180, dimensions=(50, 250))
    child.logfile_read = open(tmp_path / "transcript.txt", "w")  # noqa: SIM115 - closed with the child
    child.expect_exact(PROMPT)
    return child


def _say(child, text):
    """Type a line; returns what came back before the next prompt (reply, notes, stats)."""
    child.sendline(text)
    child.expect_exact(PROMPT)
    return child.before


def _exit_status(child):
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def test_chat_turns_commands_and_ctrl_d(tmp_path):
    child = _spawn(tmp_path, ["run", "-i"], "-n", "16")
    out = _say(child, "")
    assert "prompt " not in out and "error" not in out  # an empty line does nothing
    out = _say(child, "/help")
    assert all(c in out for c in ("/clear", "/system", "/save", "/load", "Ctrl-C"))
    out = _say(child, "What is the capital of France?")
    assert "Paris" in out and "first token" in out and "stop:" in out
    out = _say(child, "And of Italy?")
    assert "Rome" in out and "turn 2:" in out
    saved = tmp_path / "chat.json"
    assert "saved 4 messages" in _say(child, f"/save {saved}")
    msgs = json.loads(saved.read_text())
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"] and "Rome" in msgs[3]["content"]
    assert "conversation cleared" in _say(child, "/clear")
    assert "loaded 4 messages" in _say(child, f"/load {saved}")
    assert "unknown command /nope" in _say(child, "/nope")
    child.send("\x1b[A")  # up arrow: the last line again, from readline's history
    child.expect_exact("/nope")
    assert "unknown command /nope" in _say(child, "")
    child.send("/systen x\x1b[D\x1b[D\x7fm")  # left arrow twice, backspace, retype: line editing
    assert "system prompt set" in _say(child, "")
    assert "system prompt: x" in _say(child, "/system")
    child.send("half a line")
    child.expect_exact("half a line")  # echoed: readline holds it (a Ctrl-C sent sooner could beat the keys)
    child.sendintr()  # Ctrl-C on a line being typed clears it and prompts again
    child.expect_exact(PROMPT)
    assert "no system prompt" in _say(child, "/system -") + _say(child, "/system")
    child.sendeof()  # Ctrl-D at an empty prompt
    assert _exit_status(child) == 0
    assert "What is the capital of France?" in (tmp_path / "history").read_text()  # line history kept


def test_ctrl_c_system_prompt_and_full_context(tmp_path):
    child = _spawn(tmp_path, ["chat"], "-n", "40", "-c", "200", "--ignore-eos")  # guild chat = guild run -i
    assert "system prompt set" in _say(child, "/system You are a terse assistant. Answer in one line.")
    # Ctrl-C during a reply stops the reply, not the program
    child.sendline("Count from one to one hundred in words.")
    child.expect_exact("Count from one to one hundred in words.\r\n")
    child.expect(r"\w\w")  # the reply has started
    child.sendintr()
    child.expect_exact("reply stopped")
    child.expect_exact(PROMPT)
    assert "stop: interrupted" in child.before
    # the session goes on; replies fill -n (--ignore-eos), so the 200-token context fills within a few turns
    notes = ""
    for q in ("What is the capital of France?", "Name a colour.", "Name a fruit.", "Name an animal."):
        notes += _say(child, q)
        if "context full" in notes:
            break
    assert "context full (200 tokens): dropped the oldest turn" in notes and "system prompt kept" in notes
    saved = tmp_path / "after.json"
    _say(child, f"/save {saved}")
    msgs = json.loads(saved.read_text())
    assert msgs[0] == {"role": "system", "content": "You are a terse assistant. Answer in one line."}
    assert not any("Count from one" in m["content"] for m in msgs)  # the oldest turn is gone
    child.sendintr()  # Ctrl-C at an empty prompt ends the chat
    assert _exit_status(child) == 0
