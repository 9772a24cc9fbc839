#!/bin/bash
# The wheel as a user gets it: build it from this tree, install it into a fresh virtual environment
# with the `certify` extra only (no torch, TensorFlow or JAX), and run the commands a newcomer runs
# from a directory outside the checkout, so that nothing is imported from the source tree.
#
#   bash tools/wheel_check.sh [PYTHON]        (make wheel-check)
#
# Fails when the wheel lacks a subpackage a command needs, ships a development tool (probe, sweep,
# tuner, device script), or when `attnhub certify` without pytest prints anything but what to install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-python3}"
ROOT="$PWD"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/attnhub-wheel-XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
t0=$(date +%s)
step() { echo "== wheel-check: $*"; }

step "build"
"$PYTHON" -m pip wheel -q --no-deps -w "$TMP/dist" "$ROOT"
WHEEL=$(ls "$TMP"/dist/attnhub-*.whl)

step "contents of $(basename "$WHEEL")"
"$PYTHON" - "$WHEEL" <<'PY'
import re, sys, zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
dev = [n for n in names if re.search(r"probe|device_|gpu_session|gpu_certify|_tune\.py$|sweep|\.sh$", n.rsplit("/", 1)[-1])]
dev += [n for n in names if n.split("/")[0] in ("tools", "tests", "benchmarks", "scripts", "docs", "examples")]
assert not dev, f"development files in the wheel: {dev}"
for need in ("attnhub/cli/__init__.py", "attnhub/bench/grid.py", "attnhub/glue/__init__.py",
             "attnhub/ipu/__init__.py", "attnhub_backends/cuda/kernels/fwd_mma.cu",
             "attnhub_conformance/suite.py"):
    assert need in names, f"{need} is not in the wheel"
print(f"{len(names)} files, no development tools")
PY

step "fresh venv, wheel[certify]"
"$PYTHON" -m venv "$TMP/venv"
BIN="$TMP/venv/bin"
"$BIN/python" -m pip install -q -c "$ROOT/constraints-ci.txt" "$WHEEL[certify]"

cd "$TMP"  # no checkout on sys.path from here on
export PYTHONPATH= PYTHONSAFEPATH=1 ATTNHUB_CACHE_DIR="$TMP/cache"
"$BIN/python" -c "import attnhub, sys; assert '$ROOT' not in attnhub.__file__, attnhub.__file__"
for mod in torch tensorflow jax; do
  if "$BIN/python" -c "import $mod" 2> /dev/null; then echo "$mod is installed: the check is not framework-free"; exit 1; fi
done

step "attnhub --help"
"$BIN/attnhub" --help > help.txt
cat help.txt
if grep -q unavailable help.txt; then echo "a command is unavailable in the wheel"; exit 1; fi
step "attnhub info"
"$BIN/attnhub" info --no-errors
step "attnhub info --settings"
"$BIN/attnhub" info --settings > /dev/null
step "attnhub demo"
"$BIN/attnhub" demo
step "attnhub bench --help"
"$BIN/attnhub" bench --help > /dev/null
step "attnhub certify reference --quick"
"$BIN/attnhub" certify reference --quick --report "$TMP/reference-quick"

step "without pytest and hypothesis"
"$BIN/python" -m pip uninstall -q -y pytest hypothesis
"$BIN/attnhub" info --no-errors > /dev/null
if "$BIN/attnhub" certify reference --quick > certify.txt 2>&1; then
  echo "certify ran without pytest"; exit 1
fi
cat certify.txt
grep -q "pip install 'attnhub\[certify\]'" certify.txt || { echo "certify did not say what to install"; exit 1; }
if grep -q Traceback certify.txt; then echo "certify printed a traceback"; exit 1; fi

echo "== wheel-check: passed in $(( $(date +%s) - t0 )) s"
