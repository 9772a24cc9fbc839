#!/bin/bash
# Issue 5 batch on the GPU machine (one call): install, precompile, GPU tests, float32 accuracy and
# tile sweep, `attnhub bench` float32 vs sdpa-math and bfloat16 vs sdpa-flash, optional certify/ncu.
# Usage (device machine, repo root): bash benchmarks/cuda_issue5_run.sh [stages...]
#   stages: tests f32 bench32 bench16 tune ncu certify (default: all but certify); F32_ARGS=... is
#   passed to benchmarks/cuda_f32.py (e.g. "--configs" alone: default tiles only)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${*:-tests f32 bench32 bench16 tune ncu}
has() { [[ " $STAGES " == *" $1 "* ]]; }
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
date -u +"start %Y-%m-%d %H:%M:%S UTC"; git log --oneline -1 2>/dev/null
export ATTNHUB_CACHE_DIR=/tmp/attnhub-cache
python3 -m attnhub_backends.cuda.compiler sm_90 > /tmp/compile.log 2>&1; tail -1 /tmp/compile.log
if has tests; then
  timeout 240 python3 -m pytest -q -m gpu tests/test_cuda_gpu.py -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; grep -E "^FAILED|passed|failed|error" $OUT/gpu_tests.log | cut -c1-220 | tail -25
fi
if has f32; then timeout 200 python3 benchmarks/cuda_f32.py ${F32_ARGS:-} 2>&1 | tee $OUT/f32.log; fi
if has bench32; then
  date -u +"bench32 %H:%M:%S UTC"
  timeout 150 attnhub bench --backends cuda --peers sdpa-math --dtype float32 --family dense --direction fwd \
    --lengths 4096 --out /tmp/bench32 2>&1 | grep -v "^\["; cp /tmp/bench32/bench.json $OUT/bench32.json
fi
if has bench16; then
  date -u +"bench16 %H:%M:%S UTC"
  timeout 200 attnhub bench --backends cuda --peers sdpa-flash --dtype bfloat16 --family dense \
    --direction fwd,bwd --lengths 4096,8192 --out /tmp/bench16 2>&1 | grep -v "^\["; cp /tmp/bench16/bench.json $OUT/bench16.json
fi
if has tune; then timeout 150 python3 benchmarks/cuda_tune.py 2>&1 | tee $OUT/tune.log; fi
if has ncu; then
  CASE='import sys,torch,attnhub; dt=getattr(torch,sys.argv[1]); d=int(sys.argv[2]); c=sys.argv[3]=="1"
q,k,v=(torch.randn(4,2048//d,4096,d,device="cuda",dtype=dt) for _ in range(3))
for _ in range(2): attnhub.attention(q,k,v,mask="causal" if c else None,backend="cuda")
torch.cuda.synchronize()'
  for args in "float32 64 0" "bfloat16 64 1" "bfloat16 128 0"; do
    echo "== ncu $args"
    timeout 60 ncu --clock-control none -k regex:attn_fwd -s 1 -c 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section ComputeWorkloadAnalysis python3 -c "$CASE" $args 2>&1 \
      | grep -E "Duration|Throughput|Pipe|Occupancy|Registers|Stall|Issued|Eligible|Active Warps|Warp Cycles|Block Limit" | head -40
  done 2>&1 | tee $OUT/ncu.log
fi
if has certify; then
  timeout 240 attnhub certify cuda --report $OUT/certify-cuda > $OUT/certify.log 2>&1; echo "certify rc=$?"; tail -15 $OUT/certify.log
fi
date -u +"end %Y-%m-%d %H:%M:%S UTC"
