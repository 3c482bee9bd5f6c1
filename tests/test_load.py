"""guild.load: the warm-up at load leaves a chat prompt's first request nothing to compile, load or import."""

import json
import subprocess
import sys
from pathlib import Path

# in a fresh process: another test may already have compiled what the warm-up should
_SCRIPT = """
import json, sys
from tests.helpers.first_use import since, snapshot, watch
watch()
from guild.load import load
from guild.speculative.options import MtpOptions

lm = load(sys.argv[1], threads=2, progress=False)
lm.warm_up("normal", MtpOptions())
before = snapshot()
tok = lm.tokenizer
ask = [{"role": "user", "content": "Why is the sky blue during the day, and red at sunset?"}]
ids = tok.encode(tok.apply_chat_template(ask), add_special=True)
lm.session(512).generate(ids, 4)
print(json.dumps({"prompt": len(ids), **since(before)}))
"""


def test_warm_up_covers_a_chat_prompts_first_request(moe_path):
    p = subprocess.run([sys.executable, "-c", _SCRIPT, moe_path], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).parents[1])
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["prompt"] >= 40 and got["kernels"] == []
    assert got["compiled"] == 0 and got["modules"] == []  # the chat template was compiled at load
