#!/bin/bash
# One batch on the GPU machine: install, cold/warm compile timings, GPU tests, certify, tuning, bench.
# Usage (device machine, repo root): bash benchmarks/cuda_device_run.sh [tune|notune] [quick|full] [bench|nobench]
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import cuda.core, cuda.bindings, torch; print('cuda.core', cuda.core.__version__, 'cuda.bindings', cuda.bindings.__version__, 'torch', torch.__version__)"
export ATTNHUB_CACHE_DIR=/tmp/attnhub-cache; rm -rf $ATTNHUB_CACHE_DIR
FIRST='import time,torch,attnhub; q=torch.randn(1,2,256,64,device="cuda",dtype=torch.bfloat16); torch.cuda.synchronize(); t=time.perf_counter(); attnhub.attention(q,q,q,backend="cuda"); torch.cuda.synchronize(); from attnhub_backends.cuda import compiler as c; print("first call %.3f s, NVRTC compiles %d" % (time.perf_counter()-t, c.COMPILES))'
echo "cold cache:"; python -c "$FIRST"; echo "second process, warm cache:"; python -c "$FIRST"
python -m attnhub_backends.cuda.compiler sm_90 > $OUT/compile.log 2>&1; tail -1 $OUT/compile.log
timeout 200 python -m pytest -q -m gpu tests/test_cuda_gpu.py -p no:cacheprovider > $OUT/gpu_tests.log 2>&1; grep -E "^FAILED|passed|failed" $OUT/gpu_tests.log | cut -c1-200 | tail -25
if [ "${1:-tune}" = tune ]; then timeout 150 python benchmarks/cuda_tune.py 2>&1 | tee $OUT/tune.log; fi
Q=""; [ "${2:-full}" = quick ] && Q="--quick"
timeout 240 attnhub certify cuda $Q --report $OUT/certify-cuda > $OUT/certify.log 2>&1; echo "certify rc=$?"; tail -30 $OUT/certify.log
if [ "${3:-bench}" = bench ]; then timeout 240 python benchmarks/cuda_bench.py --out $OUT/bench.jsonl > $OUT/bench.log 2>&1; echo "bench rc=$?"; tail -24 $OUT/bench.log; fi
