#!/bin/bash
# The GPU-marked tests (and what to time with them) in parts that fit one device call, on the
# committed tree: run on the device machine from the repository root, the cudnn frontend wheel in .whl/.
#
#   bash tools/dev/gpu_suite.sh PART   (logs in $OUT, else .)
#
# PART a: every GPU test but the cuda and triton backends' own files (about 5 minutes);
# PART b: the cuda and triton backends' files, then the dense triton kernels before and after
# issue 38's argument packing (attnhub bench), and host overhead.
# Uncommitted changes in the copied tree are stashed first, so a run measures a commit.
set -u
DEST="${OUT:-.}"
PART="${1:-a}"
export PYTHONUNBUFFERED=1
git stash -u -q 2>/dev/null && echo "stashed uncommitted changes"
git log --oneline -1 | tee "$DEST/commit-$PART.txt"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed"
OWN="tests/test_cuda_gpu.py tests/test_cuda_modifiers_gpu.py tests/test_peaked_row_gradients.py tests/test_tiling_cuda_gpu.py tests/test_triton_gpu.py tests/test_triton_modifiers_gpu.py tests/test_triton_ragged_gpu.py tests/test_triton_compile.py tests/test_triton_ragged.py"
step() { local limit=$1 log=$2; shift 2; echo "== $*"; timeout "$limit" "$@" >"$DEST/$log" 2>&1; echo "   rc $? -> $log"; tail -n 2 "$DEST/$log"; }
if [ "$PART" = a ]; then
    ignores=""
    for f in $OWN tests/test_distributed_multigpu.py; do ignores="$ignores --ignore=$f"; done
    step 480 tests-a.log python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider -rfE tests/ $ignores
else
    step 270 tests-b.log python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider -rfE $OWN tests/test_host_path_gpu.py
    # The triton kernels before issue 38's argument packing (BASE, default 6572db0) against now, in
    # one process each, cuDNN as the drift reference: a copy of the tree with those six files.
    base=$(mktemp -d); git archive "${BASE:-6572db0}" attnhub_backends/triton | tar -xf - -C "$base"
    before=$(mktemp -d); tar --exclude=.git -cf - . | tar -xf - -C "$before"
    rm -f "$before"/attnhub_backends/triton/{args,tiles}.py
    for f in kernels ragged_kernels launch ragged_launch modifiers loader; do cp "$base/attnhub_backends/triton/$f.py" "$before/attnhub_backends/triton/"; done
    for v in before after; do
        dir=$PWD; [ $v = before ] && dir=$before
        (cd "$dir" && PYTHONPATH="$dir:${PYTHONPATH:-}" step 110 "bench-$v.log" python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn --family dense --direction fwd,bwd --lengths 4096,16384 --out "$(mktemp -d)")
    done
    step 30 host.log python3 benchmarks/host_overhead.py --rounds 10
fi
grep -E "^(FAILED|ERROR)" "$DEST"/tests-*.log | head -40
