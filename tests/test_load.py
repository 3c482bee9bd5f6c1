"""guild.load: the warm-up at load leaves a chat prompt's first request nothing to compile or load."""

import json
import subprocess
import sys

# in a fresh process: another test may already have compiled what the warm-up should
_SCRIPT = """
import gc, json, sys
from numba.core.registry import CPUDispatcher
from guild.load import load
from guild.speculative.options import MtpOptions

def overloads():
    return {f"{d.py_func.__module__}.{d.py_func.__name__}": len(d.overloads)
            for d in gc.get_objects() if isinstance(d, CPUDispatcher)}

lm = load(sys.argv[1], threads=2, progress=False)
lm.warm_up("normal", MtpOptions())
before = overloads()
tok = lm.tokenizer
ask = [{"role": "user", "content": "Why is the sky blue during the day, and red at sunset?"}]
ids = tok.encode(tok.apply_chat_template(ask), add_special=True)
lm.session(512).generate(ids, 4)
after = overloads()
print(json.dumps({"prompt": len(ids), "new": sorted(k for k, n in after.items() if n != before.get(k))}))
"""


def test_warm_up_covers_a_chat_prompts_first_request(moe_path):
    p = subprocess.run([sys.executable, "-c", _SCRIPT, moe_path], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["prompt"] >= 40 and got["new"] == []
