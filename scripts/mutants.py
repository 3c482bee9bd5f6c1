"""Mutation check: plant known bugs in guild one at a time and run the default-tier tests that should catch each.

    python scripts/mutants.py              every mutant, then a table: bug, killed, the test that failed
    python scripts/mutants.py --list       the mutants and the tests each runs
    python scripts/mutants.py --only NAME  one mutant (repeatable)
    python scripts/mutants.py --json       the results as JSON on stdout

The tree (git's tracked and untracked, not ignored, files) is copied once to a temporary directory; each mutant is
a text patch applied there, the tests run there (`python -m pytest -x -q TESTS`, the copy first on the path), and
the file is put back with its old timestamp. The checkout is never written, so an interrupted run leaves nothing
mutated. Numba caches kernels by source path and timestamp: the copy's cache is its own (NUMBA_CACHE_DIR), and a
restored file's timestamp makes its compiled kernels valid again. Exit status 1 when a mutant survives.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in file
    new: str
    tests: tuple[str, ...]  # pytest node ids or files of the default tier (no oracle marker needed)
    what: str


MUTANTS = (
    Mutant("seed-ignored", "guild/engine/sampling.py",
           "u = philox_uniform(p.seed, position)", "u = philox_uniform(0, position)",
           ("tests/engine/test_speculative.py",),
           "sampling draws u_q with seed 0 whatever --seed says"),
    Mutant("philox-counter-off-by-one", "guild/engine/sampling.py",
           "np.random.Philox(key=seed, counter=q)", "np.random.Philox(key=seed, counter=q + 1)",
           ("tests/engine/test_sampling.py",),
           "u_q read from counter q + 1"),
    Mutant("row-limit-off-by-one", "kernels/cpu/quant.py",
           "ROW_INVARIANT_ROWS = _GEMV_PATH_ROWS ", "ROW_INVARIANT_ROWS = _GEMV_PATH_ROWS + 1 ",
           ("tests/kernels/test_batch_rows.py",),
           "the row-invariant limit that sessions and the server batch by is one past the GEMV path"),
    Mutant("row-limit-comparison", "kernels/cpu/quant.py",
           "if T <= _GEMV_PATH_ROWS or w.n_rows <= NARROW_ROWS:", "if T < _GEMV_PATH_ROWS or w.n_rows <= NARROW_ROWS:",
           ("tests/kernels/test_batch_rows.py",),
           "a call of exactly ROW_INVARIANT_ROWS rows goes through BLAS"),
    Mutant("rope-base-x10", "guild/models/base.py",
           'rope_base=g.get(f"{a}.rope.freq_base", float, cls.rope_base)',
           'rope_base=10 * g.get(f"{a}.rope.freq_base", float, cls.rope_base)',
           ("tests/models/test_model.py::test_matches_reference",),
           "the model's rope base is ten times the GGUF's"),
    Mutant("rope-position-slip-past-1k", "kernels/cpu/ops/rows.py",
           "        p = positions[t]\n", "        p = positions[t] - (positions[t] >= 1024)\n",
           ("tests/kernels/ops/test_attention_long.py",),
           "queries and keys at positions 1024 and later are rotated one position short"),
    Mutant("attention-span-capped-1k", "kernels/cpu/ops/gqa.py",
           "    L = pos0 + t + 1\n", "    L = min(pos0 + t + 1, 1024)\n",
           ("tests/kernels/ops/test_attention_long.py",),
           "one-row attention reads only the first 1024 positions of the cache"),
    Mutant("yarn-factor-wrong", "kernels/rope.py",
           "mscale *= 1.0 + 0.1 * math.log(scaling.factor)", "mscale *= 1.0 + 0.1 * math.log(2 * scaling.factor)",
           ("tests/models/test_rope.py",),
           "YaRN's magnitude scale computed from twice the factor"),
    Mutant("tokenizer-merge-out-of-order", "guild/text/vocab.py",
           "model = BPE(vocab, merges, ignore_merges=ignore_merges)",
           "model = BPE(vocab, merges[1:] + merges[:1], ignore_merges=ignore_merges)",
           ("tests/text/test_tokenizer.py",),
           "the first (highest-priority) BPE merge moved to the end"),
    Mutant("q8_0-kv-scale-wrong", "kernels/cpu/ops/kv.py",
           "db = amax / np.float32(127.0)", "db = amax / np.float32(128.0)",
           ("tests/kernels/ops/test_kv.py",),
           "the q8_0 KV cache's block scale is max|x| / 128"),
    Mutant("q8_0-kv-ties-away-from-zero", "kernels/cpu/ops/kv.py",
           "qs[n, i] = np.int8(np.rint(x[n, i] * inv))",
           "qs[n, i] = np.int8(np.trunc(x[n, i] * inv + np.copysign(np.float32(0.5), x[n, i])))",
           ("tests/kernels/ops/test_kv.py",),
           "the q8_0 KV quantiser rounds ties half away from zero (ggml's reference) instead of to even (its CPU's)"),
    Mutant("expert-index-swapped", "kernels/cpu/moe.py",
           "order[j] = t * k + r", "order[j] = t * k + (k - 1 - r)",
           ("tests/kernels/test_moe.py",),
           "a row's expert outputs attached to the reverse ranks (each weighted by another expert's weight)"),
    Mutant("top-k-tie-order-flipped", "guild/engine/sampling.py",
           "tied = np.flatnonzero(z == thr)[: k - above.size]",
           "tied = np.flatnonzero(z == thr)[::-1][: k - above.size]",
           ("tests/engine/test_sampling.py",),
           "top-k keeps the higher ids among tied logits at the boundary"),
    Mutant("repack-nibble-order-swapped", "kernels/cpu/qdot/packers.py",
           "qs[t, j, 8 * sb + 2 * c, q, lane] = (lo & 0x0F0F0F0F) | ((hi & 0x0F0F0F0F) << 4)",
           "qs[t, j, 8 * sb + 2 * c, q, lane] = (hi & 0x0F0F0F0F) | ((lo & 0x0F0F0F0F) << 4)",
           ("tests/kernels/test_quant.py::test_dequantize_bit_exact",),
           "the int8 repack puts a Q4_K/Q5_K sub-block's second 16 nibbles first"),
    Mutant("fp32-block-scale-dropped", "kernels/cpu/quant_gen.py",
           "                        a = fma32(i2f(qs[g, b, u, n]) * dd, x0, a)\n",
           "                        a = fma32(i2f(qs[g, b, u, n]), x0, a)\n",
           ("tests/kernels/test_quant_f32.py::test_f32_gemv_matches_the_twin",),
           "Q8_0's fp32 GEMV (T = 1) multiplies one quant per 8 without its block scale"),
    Mutant("hybrid-state-not-rolled-back", "guild/engine/state.py",
           "self.cur = int(self.dst[keep - 1])", "self.cur = int(self.dst[T - 1])",
           ("tests/models/test_hybrid.py::test_commit_keep_equals_plain_decoding",),
           "a hybrid model's recurrent state keeps the rejected rows' state after commit(keep)"),
)


def _copy_tree(dst: Path) -> None:
    """The checkout's tracked and untracked (not ignored) files, as they are now."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file() and not src.is_symlink():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    # the editable install maps guild.kernels and guild.calib to top-level folders of the checkout: links inside
    # the copy's guild/ make the copy's own files the ones imported
    for pkg in ("kernels", "calib"):
        (dst / "guild" / pkg).symlink_to(Path("..") / pkg)


def _failed_test(out: str) -> str:
    m = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)  # node ids may hold spaces
    return m.group(1) if m else ""


def run_mutant(m: Mutant, tree: Path, env: dict) -> dict:
    path = tree / m.file
    text = path.read_text()
    if text.count(m.old) != 1:
        return {**asdict(m), "killed": None, "test": f"patch does not apply ({text.count(m.old)} matches)"}
    st = path.stat()
    t0 = time.monotonic()
    try:
        path.write_text(text.replace(m.old, m.new))
        r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                           cwd=tree, env=env, capture_output=True, text=True)
    finally:
        path.write_text(text)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the original's compiled kernels are valid again
    out = r.stdout + r.stderr
    killed = r.returncode == 1 and bool(_failed_test(out))  # 1: tests failed (2-5: errors of the run itself)
    return {**asdict(m), "killed": killed, "test": _failed_test(out) if killed else f"exit {r.returncode}",
            "seconds": round(time.monotonic() - t0, 1), "tail": "" if killed else out[-2000:]}


def _baseline(tree: Path, env: dict, tests: list[str]) -> str:
    """'' when the unmutated copy passes every mutant's tests, else pytest's output tail."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=tree, env=env,
                       capture_output=True, text=True)
    return "" if r.returncode == 0 else (r.stdout + r.stderr)[-3000:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/mutants.py", description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    ap.add_argument("--only", action="append", metavar="NAME", help="run this mutant (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated copy")
    a = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not a.only or m.name in a.only]
    if a.only and len(chosen) != len(set(a.only)):
        ap.error(f"unknown mutant; one of {', '.join(m.name for m in MUTANTS)}")
    if a.list:
        for m in chosen:
            print(f"{m.name:32} {m.file:28} {' '.join(m.tests)}\n{'':32} {m.what}")
        return 0
    with tempfile.TemporaryDirectory(prefix="guild-mutants-") as tmp:
        tree = Path(tmp) / "tree"
        _copy_tree(tree)
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1",
               "NUMBA_CACHE_DIR": str(Path(tmp) / "numba-cache")}
        if not a.no_baseline:  # a mutant only counts as killed where the same tests pass without it
            print("baseline: the mutants' tests on the unmutated copy ...", file=sys.stderr, flush=True)
            bad = _baseline(tree, env, sorted({t for m in chosen for t in m.tests}))
            if bad:
                print(bad + "\nbaseline failed: fix the tests first", file=sys.stderr)
                return 2
        results = []
        for m in chosen:
            print(f"{m.name} ...", file=sys.stderr, flush=True)
            results.append(run_mutant(m, tree, env))
    if a.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"{'bug':32} {'killed':7} test that failed")
        for r in results:
            k = {True: "yes", False: "NO", None: "n/a"}[r["killed"]]
            print(f"{r['name']:32} {k:7} {r['test']}")
        for r in results:
            if not r["killed"] and r.get("tail"):
                print(f"\n--- {r['name']} survived; pytest's output:\n{r['tail']}", file=sys.stderr)
    return 0 if all(r["killed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
