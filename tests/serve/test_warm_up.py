"""guild serve's warm-up request: once /health says ready, a first chat request loads no Numba kernel, compiles
no Jinja template and imports no module, and finds the chat template's opening already cached. With the kernel
cache cold, the loader's warm-up (and its compile helper, guild.warmup) runs first."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# a fresh process: another test may already have loaded what the warm-up should
_SCRIPT = """
import json, os, signal, sys, threading, time, urllib.error, urllib.request
from tests.helpers.first_use import since, snapshot, watch
watch()
from guild.engine.options import DecodeOptions
from guild.serve import ServeOptions, serve
from guild.bench.server import free_port
import guild.load, guild.warmup

port, out = free_port(), {"log": [], "warm_up": 0}
if sys.argv[2] == "cold":  # as on a first run, whatever the kernel cache holds
    guild.warmup.kernels_cold = lambda: True
real = guild.load.LoadedModel.warm_up
def warm_up(self, *a):
    out["warm_up"] += 1
    return real(self, *a)
guild.load.LoadedModel.warm_up = warm_up
def client():
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=120).read()
                break
            except urllib.error.HTTPError as e:  # 503 while warming up
                out["loading"] = e.code
            except OSError:
                pass
            time.sleep(0.05)
        before = snapshot()
        ask = [{"role": "user", "content": "Why is the sky blue during the day, and red at sunset?"}]
        body = json.dumps({"messages": ask, "max_tokens": 4, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        lines = [x.decode().strip() for x in urllib.request.urlopen(req, timeout=600)]
        usage = next(json.loads(x[6:])["usage"] for x in lines if x.startswith("data: {") and '"usage"' in x)
        out.update(since(before), cached=usage["prompt_tokens_details"]["cached_tokens"],
                   prompt=usage["prompt_tokens"],
                   requests=urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())
    finally:
        os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=client, daemon=True).start()
out["cold"] = guild.warmup.kernels_cold()  # "cached": whatever the kernel cache holds when this test runs
serve(sys.argv[1], DecodeOptions(device="cpu"), ServeOptions(port=port), log=out["log"].append)
print(json.dumps(out))
"""


@pytest.mark.parametrize("kernels", ["cached", "cold"])
def test_first_request_after_ready_loads_nothing(moe_path, kernels):
    p = subprocess.run([sys.executable, "-c", _SCRIPT, moe_path, kernels], capture_output=True, text=True,
                       timeout=600, cwd=Path(__file__).parents[2])
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["prompt"] >= 40
    assert got["kernels"] == [] and got["compiled"] == 0 and got["modules"] == []
    assert got.get("loading") == 503  # /health said so while the warm-up request ran
    assert 0 < got["cached"] < got["prompt"]  # the chat template's opening, from the warm-up's pooled session
    # the warm-up request is not counted: only the client's
    assert 'guild_requests_total{endpoint="/v1/chat/completions",status="200"} 1\n' in got["requests"]
    compiling = [line for line in got["log"] if "compiling kernels" in line]
    assert got["cold"] or kernels == "cached"
    assert (got["warm_up"], len(compiling)) == ((1, 1) if got["cold"] else (0, 0)), got["log"]
