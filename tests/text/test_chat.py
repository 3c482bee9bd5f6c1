"""Multi-turn chat: the session keeps its cache across turns and feeds only the new tokens."""

import json
import subprocess
import sys

import numpy as np

from guild.engine.session import GuildSession
from guild.kernels.cpu.ops import get_keys
from guild.load import load
from guild.text.chat import Conversation


def test_turns_reuse_the_cache(dense_path):
    lm = load(dense_path, numerics="f32")  # the fp32 path answers this prompt right; int8, like llama.cpp, not
    s = GuildSession(lm.model, n_ctx=512, eos_ids=lm.tokenizer.eos_ids)
    conv = Conversation(s, lm.tokenizer)
    t1 = conv.say("What is the capital of France?", 24)
    assert "Paris" in t1.text
    held = len(s.tokens)
    t2 = conv.say("And of Italy?", 24)
    assert "Rome" in t2.text
    # only the new turn's tokens were fed: far fewer than the whole rendered conversation
    full = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(conv.messages[:3]), add_special=True)
    assert t2.stats.prompt_tokens == len(full) - held
    assert s.tokens[: len(full)] == full


def test_divergent_history_is_rewound(dense_path):
    lm = load(dense_path)
    s = GuildSession(lm.model, n_ctx=512, eos_ids=lm.tokenizer.eos_ids)
    conv = Conversation(s, lm.tokenizer)
    conv.say("Name a colour.", 8)
    s.tokens[-3] = 12345  # pretend the reply was tokenised differently
    n_before = len(s.tokens)
    t = conv.say("Another one?", 8)
    assert t.stats.prompt_tokens > 3
    full = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(conv.messages[:3]), add_special=True)
    assert s.tokens[: len(full)] == full and len(s.tokens) >= n_before - 3
    assert not get_keys(s.state.k, s.state.pos, s.state.v.shape[2]).any()


def test_truncate_forgets_rows(dense_model):
    s = GuildSession(dense_model, n_ctx=64)
    s.prefill(np.arange(100, 120))
    s.rewind(5)
    assert s.state.pos == 5 and len(s.tokens) == 5
    assert not s.state.v[:, :, 5:].any()


def test_conversation_file_cli(tmp_path):
    conv = tmp_path / "conv.yaml"
    conv.write_text("- What is the capital of France?\n- role: user\n  content: And of Italy?\n")
    r = subprocess.run([sys.executable, "-m", "guild", "run", "smollm2-135m", "--conversation", str(conv), "-n", "16",
                        "--json", "--numerics", "f32"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    turns = [json.loads(ln) for ln in r.stdout.splitlines()]  # one JSON line per turn
    assert [t["turn"] for t in turns] == [1, 2] and "Rome" in turns[1]["text"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("{not: a list}")
    from typer.testing import CliRunner

    from guild.cli import app

    r = CliRunner().invoke(app, ["run", "smollm2-135m", "--conversation", str(bad)])  # the command's own check
    assert r.exit_code == 1 and "--conversation" in r.stderr and type(r.exception) is SystemExit  # no traceback
