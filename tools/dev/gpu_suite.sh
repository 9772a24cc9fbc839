#!/bin/bash
# The GPU-marked tests (and what to time with them) in parts that fit one device call. Run on the
# device machine from the repository root, the cudnn frontend wheel in .whl/:
#
#   COMMIT=$(git rev-parse --short HEAD) bash tools/dev/gpu_suite.sh PART   (logs in $OUT, else .)
#
# The device machine's copy carries the working tree but not this checkout's git history (its
# HEAD is stale), so the commit is passed in; commit first, so that the tree is that commit.
#
# PART a: every GPU test but the cuda and triton backends' own files and the slow ones below (-n 16
#         cut the full set at 94 % of its 400 s on an H200, 2026-11-29, leaving the slow ones);
# PART slow: the GPU tests that check whole models or many requests against the float64 oracle
#         (transformers, random requests, ragged modifiers, jax modifiers; about 300 s at -n 8);
# PART b: the cuda and triton backends' files, then the dense triton kernels before and after
#         issue 38's argument packing (attnhub bench), and host overhead;
# PART core: one call's worth after a change to the backend contract and the kernels' arguments:
#         the triton, cuda, sdpa, cudnn, jax and conformance GPU files, then the dense triton
#         kernels before and after (carry .baseline-triton). About 1 450 tests: more than its 400 s
#         at -n 16 on an H200 (2026-11-29: cut at 73%); a and b together cover every GPU test;
# PART cert NAME: NAME's full certification on the GPU (reports NAME-h200-full.json/.md).
# PART certs: cuda, cudnn and the three sdpa backends' full certifications side by side (about
#         70 s each on an H200, 2026-11-29), their reports and logs in one certs.tar.gz (a call
#         brings back 8 files at most); jax's takes more than 470 s at -j 4: give it `cert jax`.
set -u
DEST="${OUT:-.}"
PART="${1:-a}"
export PYTHONUNBUFFERED=1
echo "${COMMIT:-unknown commit}" | tee "$DEST/commit-$PART.txt"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed"
TRITON_FILES="tests/test_triton_gpu.py tests/test_triton_modifiers_gpu.py tests/test_triton_ragged_gpu.py tests/test_triton_compile.py tests/test_triton_ragged.py tests/test_host_path_gpu.py"
TIMED="tests/test_first_use_gpu.py tests/test_tune_cli.py"
CUDA_FILES="tests/test_cuda_gpu.py tests/test_cuda_modifiers_gpu.py tests/test_peaked_row_gradients.py tests/test_tiling_cuda_gpu.py"
SLOW_FILES="tests/test_transformers_gpu.py tests/test_random_requests_gpu.py tests/test_ragged_modifiers_gpu.py tests/test_jax_modifiers_gpu.py"
step() { local limit=$1 log=$2; shift 2; echo "== $*"; timeout "$limit" "$@" >"$DEST/$log" 2>&1; echo "   rc $? -> $log"; tail -n 2 "$DEST/$log"; }
# A program (timeout runs it), -v: every result line names its test, so a run its limit cuts still
# says which tests failed (-q printed only dots, and the -rfE summary comes at the very end).
PYTEST="python3 -m pytest -v -m gpu -n 16 -p no:cacheprovider -rfE"
# The dense triton kernels before issue 38's argument packing against now, one process each, cuDNN
# as the drift reference: a copy of the tree with the six files of .baseline-triton/ (made here
# before the call: git archive 6572db0 attnhub_backends/triton | tar -x -C .baseline-triton).
bench_before_after() {
    local limit=$1 lengths=$2 before
    [ -d .baseline-triton/attnhub_backends/triton ] || { echo "no .baseline-triton: bench skipped"; return; }
    before=$(mktemp -d); tar --exclude=.git --exclude=.baseline-triton -cf - . | tar -xf - -C "$before"
    rm -f "$before"/attnhub_backends/triton/{args,tiles}.py
    for f in kernels ragged_kernels launch ragged_launch modifiers loader; do
        cp ".baseline-triton/attnhub_backends/triton/$f.py" "$before/attnhub_backends/triton/"
    done
    for v in before after; do
        local dir=$PWD; [ $v = before ] && dir=$before
        (cd "$dir" && PYTHONPATH="$dir:${PYTHONPATH:-}" step "$limit" "bench-$v.log" python3 -m attnhub.cli bench \
            --backends triton --peers sdpa-cudnn --family dense --direction fwd,bwd $lengths --out "$(mktemp -d)")
    done
}
if [ "$PART" = a ]; then
    ignores=""
    for f in $TRITON_FILES $CUDA_FILES $TIMED $SLOW_FILES tests/test_distributed_multigpu.py; do ignores="$ignores --ignore=$f"; done
    step 400 tests-a.log $PYTEST tests/ $ignores
    # Tests that time the GPU (first-use measurement, tune's picks) in a process of their own: with
    # 15 other workers on the GPU their timings are noise (2026-11-29: both failed under -n 16).
    step 120 tests-a-timed.log python3 -m pytest -v -m gpu -p no:cacheprovider -rfE $TIMED
elif [ "$PART" = slow ]; then
    step 450 tests-slow.log python3 -m pytest -v -m gpu -n 8 -p no:cacheprovider -rfE --durations=10 $SLOW_FILES
elif [ "$PART" = b ]; then
    step 330 tests-b.log $PYTEST $TRITON_FILES $CUDA_FILES
    bench_before_after 60 "--lengths 4096"
    step 30 host.log python3 benchmarks/host_overhead.py --rounds 10
elif [ "$PART" = cert ]; then
    # One backend's full certification (the triton one took 515 s on an H100: one call each).
    name="${2:?which backend: gpu_suite.sh cert NAME}"
    step 560 "certify-$name.log" attnhub certify "$name" --device cuda -j 16 --seed "${SEED:-20261129}" \
        --report "$DEST/$name-h200-full"
elif [ "$PART" = certs ]; then
    work=$(mktemp -d)
    for name in cuda cudnn sdpa-flash sdpa-efficient sdpa-cudnn; do
        timeout 300 attnhub certify "$name" --device cuda -j 3 --seed "${SEED:-20261129}" \
            --report "$work/$name-h200-full" >"$work/certify-$name.log" 2>&1 &
    done
    wait
    grep -h "cases:" "$work"/certify-*.log
    tar -czf "$DEST/certs.tar.gz" -C "$work" .
else
    step 400 tests-core.log $PYTEST $TRITON_FILES $CUDA_FILES tests/test_sdpa_backends.py tests/test_cudnn_backend.py tests/test_conformance_gpu.py tests/test_fast_path.py tests/test_jax_gpu.py tests/test_torch_compile.py tests/test_sdpa_nan.py
    bench_before_after 60 "--lengths 4096"
fi
grep -hE "(^|\] )(FAILED|ERROR) " "$DEST"/tests-*.log | head -40
