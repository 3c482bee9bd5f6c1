"""The command line as llama.cpp and Ollama users expect it: --version, -h, aliases, plain flag help, prompts from
stdin and files, --stop, --system, --ignore-eos, --chat-template, the KV cache types, and the --json schema
(guild.run/1)."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from guild.cli import app

DENSE = ["smollm2-135m", "-t", "1", "--device", "cpu"]


@pytest.fixture(autouse=True, scope="module")
def _load_once():
    """Load the model once for this file's in-process runs (guild.cli.run.load_for, cached): the flags are under test
    here, the loader elsewhere (test_run, test_repl_pty run the whole program)."""
    import guild.cli.run as gr

    real, cache = gr.load_for, {}

    def load_for(model, opts, threads=None):
        key = (model, opts.device, opts.mtp, opts.kv, threads)
        if key not in cache:
            cache[key] = real(model, opts, threads)
        return cache[key]

    gr.load_for = load_for
    yield
    gr.load_for = real


def _run(*args, input=None):
    r = CliRunner().invoke(app, ["run", *DENSE, *args], input=input)
    assert r.exit_code == 0, (r.output, r.exception)
    return r


def _json(*args, input=None):
    lines = [ln for ln in _run(*args, "--json", input=input).stdout.splitlines() if ln.strip()]
    return [json.loads(ln) for ln in lines]


def test_version_help_and_plain_flags():
    r = subprocess.run([sys.executable, "-m", "guild", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().startswith("guild 0.")
    for cmd in (["run", "-h"], ["bench", "-h"], ["-h"]):
        r = CliRunner().invoke(app, cmd, env={"COLUMNS": "200"})
        assert r.exit_code == 0 and "Usage" in r.stdout and "<bool>" not in r.stdout, cmd
    run_help = CliRunner().invoke(app, ["run", "-h"], env={"COLUMNS": "200"}).stdout
    bench_help = CliRunner().invoke(app, ["bench", "-h"], env={"COLUMNS": "200"}).stdout
    for flag in ("--ctx-size", "--draft-max", "--seed", "--temp", "--stop", "--system", "--file", "--ignore-eos",
                 "--chat-template", "--model", "--n-predict"):
        assert flag in run_help, flag
    for flag in ("--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
                 "--frequency-penalty", "--presence-penalty", "--seed"):  # the same sampling flags on both
        assert flag in run_help and flag in bench_help, flag


def test_json_schema_stdin_prompt_and_aliases():
    (a,) = _json("-p", "-", "-n", "6", "-c", "256", "-s", "7", "--draft-max", "2", input="The capital of France is")
    assert a["schema"] == "guild.run/1" and a["turn"] == 1
    assert a["prompt_ids"] == [504, 3575, 282, 4649, 314] and a["text"].startswith(" Paris")
    assert a["sampling"]["seed"] == 7 and a["sampling"]["greedy"] is True and a["context"] == 256
    for key in ("threads", "prompt_tokens", "generated_tokens", "windows", "drafted", "accepted", "max_tokens"):
        assert type(a[key]) is int, key
    for key in ("load_ms", "ttft_ms", "prefill_tok_s", "decode_tok_s", "prefill_ms", "decode_ms"):
        assert isinstance(a[key], float) and a[key] > 0, key
    assert a["ttft_ms"] >= a["prefill_ms"] and a["device"] == "cpu" and a["device_reason"] == ""
    # -m and the positional model are the same thing; -f reads the prompt from a file
    r = CliRunner().invoke(app, ["run", "-m", "smollm2-135m", "smollm2-135m-moe", "-p", "x"])
    assert r.exit_code == 1 and "two models" in r.stderr


def test_prompt_file_and_bad_input(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("The capital of France is")
    r = _run("-f", str(f), "-n", "2", "-v")
    assert r.stdout.startswith(" Paris")
    assert "loading smollm2-135m" in r.stderr and "loaded SmolLM2" in r.stderr and "first token" in r.stderr
    (a,) = _json("-f", str(f), "-n", "2")
    assert a["prompt_ids"] == [504, 3575, 282, 4649, 314]
    for args, needle in ((["-f", str(tmp_path / "none.txt")], "-f/--file"),
                         (["-f", str(f), "-p", "x"], "not both"),
                         (["-p", "x", "--system", "be brief"], "--system needs --chat"),
                         (["-p", "x", "--stop", ""], "--stop")):
        r = CliRunner().invoke(app, ["run", *DENSE, *args])
        assert r.exit_code == 1 and needle in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)


@pytest.mark.parametrize("strategy", ["normal", "lookup", "adaptive"])
def test_stop_strings_end_to_end(strategy):
    # greedy: " Paris.\n\nThe answer is:"; the stop string spans the tokens ".", "\n", "\n", "The"
    (a,) = _json("-p", "The capital of France is", "-n", "12", "--stop", "\n\nThe", "--stop", "never",
                 "--decode-strategy", strategy)
    assert a["text"] == " Paris." and a["stop_reason"] == "stop" and a["stop"] == ["\n\nThe", "never"]
    assert a["tokens"] == [7042, 30, 198, 198, 504]  # every strategy stops at the same token


def test_ignore_eos_system_and_conversation_lines(tmp_path):
    (a,) = _json("--chat", "-p", "Say hi.", "-n", "40", "--ignore-eos", "--decode-strategy", "normal")
    assert a["generated_tokens"] == 40 and a["stop_reason"] == "max_tokens" and 2 in a["tokens"]  # past <|im_end|>
    conv = tmp_path / "c.yaml"
    conv.write_text("- role: system\n  content: You are a pirate called Captain Zorg.\n"
                    "- What is your name?\n- And the capital of France?\n")
    lines = _json("--conversation", str(conv), "-n", "12")
    assert [x["turn"] for x in lines] == [1, 2] and lines[0]["system"] == "You are a pirate called Captain Zorg."
    from guild.text.tokenizer import Tokenizer
    from guild.upcycle import embedded_dense_path

    tok = Tokenizer.from_gguf(embedded_dense_path())
    assert "Captain Zorg" in tok.decode(lines[0]["prompt_ids"])  # the system message reached the model
    assert lines[1]["prompt_ids"][0] != lines[0]["prompt_ids"][0]  # turn 2 fed only its new tokens


def test_chat_template_file(tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}[assistant] {% endif %}")
    (a,) = _json("--chat", "-p", "Hello there", "-n", "2", "--chat-template", str(t))
    from guild.text.tokenizer import Tokenizer
    from guild.upcycle import embedded_dense_path

    assert Tokenizer.from_gguf(embedded_dense_path()).decode(a["prompt_ids"]).endswith(
        "[user] Hello there\n[assistant] ")
    for body, needle in (("{% for m in messages %}", "invalid Jinja"), ("no messages here", "does not show"),
                         ("{{ messages[0].content * 100000000 }}", "limit")):
        t.write_text(body)
        r = CliRunner().invoke(app, ["run", *DENSE, "--chat", "-p", "x", "--chat-template", str(t)])
        assert r.exit_code == 1 and "--chat-template" in r.stderr and needle in r.stderr, r.stderr


def test_interactive_json_lines_from_a_pipe():
    lines = _json("-i", "-n", "8", input="What is the capital of France?\n\n/system Be brief.\nAnd of Italy?\n")
    assert [x["turn"] for x in lines] == [1, 2] and "Paris" in lines[0]["text"]
    assert lines[0]["system"] is None and lines[1]["system"] == "Be brief."  # the system prompt in force


def test_brackets_survive_and_mtp_head_inspect(tmp_path):
    missing = tmp_path / "[q4] model.gguf"
    r = CliRunner().invoke(app, ["run", str(missing), "-p", "x"])
    assert r.exit_code == 1 and "[q4] model.gguf" in r.stderr
    head = "guild/heads/smollm2-135m-moe.mtp.gguf"
    r = CliRunner().invoke(app, ["inspect", head], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and all(x in r.stdout for x in ("MTP head", "drafts for", "held-out acceptance"))
    assert "context length" not in r.stdout and "layers" not in r.stdout and "mtp train." not in r.stdout
    d = json.loads(CliRunner().invoke(app, ["inspect", head, "--json"]).stdout)
    assert d["kind"] == "mtp_head" and d["base"]["name"] == "smollm2-135m-moe.gguf" and d["draft_vocab"] == 8192
    assert d["block"] == {"layers": 1, "ffn": "moe", "expert_count": 8, "embedding_length": 576}
    # the shipped head fuses a low, a middle and a high block with the final hidden and was trained to chain twice
    assert d["feature_layers"] == [2, 14, 26] and d["training"]["depth"] == 2
    assert "fused with the outputs of trunk blocks 2, 14, 26" in r.stdout and "second draft right" in r.stdout


def test_install_hint_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as on a machine without guild[train]
    r = CliRunner().invoke(app, ["train-mtp", "smollm2-135m", "-o", str(tmp_path / "h.gguf")])
    assert r.exit_code == 1 and "pip install 'guild[train]'" in r.stderr, r.stderr


def test_cold_kernel_cache_is_noticed(tmp_path):
    code = "from guild.warmup import kernels_cold; print(kernels_cold())"
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.stdout.strip() == "True", r.stderr  # an empty Numba cache: the kernels will compile


@pytest.mark.parametrize("n", [1, 2, 4])
def test_a_cut_mid_character_shows_no_replacement_character(n):
    # greedy: "🌆🌞🌟…", each emoji spread over tokens; -n 1, 2 and 4 end inside one
    r = _run("-p", "Write five emoji about the sea: 🌊", "-n", str(n))
    (a,) = _json("-p", "Write five emoji about the sea: 🌊", "-n", str(n))
    assert "\ufffd" not in r.stdout and "\ufffd" not in a["text"] and a["generated_tokens"] == n
    assert r.stdout.rstrip("\n") == a["text"] and a["text"] == "🌆🌞🌟"[: len(a["text"])]


def test_kv_cache_type_flags():
    for cmd in ("run", "serve", "bench", "optimize"):
        out = CliRunner().invoke(app, [cmd, "-h"], env={"COLUMNS": "200"}).stdout
        assert "--cache-type-k" in out and "--cache-type-v" in out and "-ctk" in out, cmd
    args = ("-p", "The capital of France is", "-n", "8", "-ctk", "q8_0", "--cache-type-v", "f16")
    normal = _json(*args, "--decode-strategy", "normal")[0]
    assert (normal["cache_type_k"], normal["cache_type_v"]) == ("q8_0", "f16")
    assert _json(*args, "--decode-strategy", "lookup")[0]["tokens"] == normal["tokens"]
    assert _json("-p", "The capital of France is", "-n", "8")[0]["cache_type_k"] == "f32"  # the default
    bad = CliRunner().invoke(app, ["run", *DENSE, "-p", "x", "--cache-type-v", "q4_0"])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert bad.output.strip() == "error: --cache-type-v must be one of f32, f16, q8_0, got 'q4_0'"
