#!/bin/bash
# One device call for the cuda backend: GPU tests, full certify, `attnhub bench`, an ncu look at the
# bf16 forward. Usage (device machine, repo root): bash scripts/device_cuda_round.sh [stages...]
#   stages: tests certify bench bench32 prep ncu ncubwd (default: tests certify bench ncu); results under $OUT.
#   prep: benchmarks/cuda_f16x3_prep.py (the 3xFP16 forward's time split and small calls).
#   CERTIFY_SEED=n: the certify stage's seed (the same cases as an earlier report).
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
STAGES=${*:-tests certify bench ncu}
has() { [[ " $STAGES " == *" $1 "* ]]; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"; git log --oneline -1 2>/dev/null
if has tests; then
  timeout 320 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_cuda_gpu.py \
    tests/test_peaked_row_gradients.py tests/test_conformance_gpu.py > "$OUT/cuda-tests.log" 2>&1
  echo "== tests rc=$?"; tail -2 "$OUT/cuda-tests.log"; grep -E "^FAILED" "$OUT/cuda-tests.log" | head
fi
if has certify; then
  timeout 200 python3 -m attnhub.cli certify cuda --device cuda ${CERTIFY_SEED:+--seed $CERTIFY_SEED} --report "$OUT/cuda-gpu-full" \
    > "$OUT/cuda-certify.log" 2>&1
  echo "== certify rc=$?"; grep -E "cases:|certified|FAIL" "$OUT/cuda-certify.log" | tail -4
fi
if has bench; then
  timeout 200 python3 -m attnhub.cli bench --backends cuda --peers sdpa-flash,sdpa-cudnn --family dense \
    --direction fwd,bwd --lengths 4096,8192 --out "$OUT/cuda-bench" > "$OUT/cuda-bench.log" 2>&1
  echo "== bench rc=$?"; grep -E "^dense|^case" "$OUT/cuda-bench.log"
fi
if has bench32; then
  timeout 150 python3 -m attnhub.cli bench --backends cuda --peers sdpa-math --dtype float32 --family dense \
    --direction fwd --lengths 4096 --out "$OUT/cuda-bench-f32" > "$OUT/cuda-bench-f32.log" 2>&1
  echo "== bench32 rc=$?"; grep -E "^dense|^case" "$OUT/cuda-bench-f32.log"
fi
if has prep; then
  timeout 120 python3 benchmarks/cuda_f16x3_prep.py 2>&1 | grep -v -i warn | tee "$OUT/f16x3-prep.log"
fi
if has ncu; then
  CASE='import sys,torch,attnhub; d=int(sys.argv[1]); c=sys.argv[2]=="1"
q,k,v=(torch.randn(4,2048//d,4096,d,device="cuda",dtype=torch.bfloat16) for _ in range(3))
for _ in range(2): attnhub.attention(q,k,v,mask="causal" if c else None,backend="cuda")
torch.cuda.synchronize()'
  for args in "64 0" "128 0"; do
    tag=${args// /_}
    timeout 90 ncu --clock-control none -k regex:attn_fwd -s 1 -c 1 --section SpeedOfLight \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
      --section SourceCounters -o "$OUT/fwd_$tag" -f python3 -c "$CASE" $args > /dev/null 2>&1
    ncu --import "$OUT/fwd_$tag.ncu-rep" --page details > "$OUT/fwd_$tag-details.txt" 2>&1
    ncu --import "$OUT/fwd_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/fwd_$tag-sass.csv" 2>&1
    echo "== ncu $args"; grep -E "Duration|Pipe Utilization|Issued Ipc|Stall|Warp Cycles Per Issued" "$OUT/fwd_$tag-details.txt" | head -12
    rm -f "$OUT/fwd_$tag.ncu-rep"
  done
fi
if has ncubwd; then
  CASE='import sys,torch,attnhub; d=int(sys.argv[1]); c=sys.argv[2]=="1"
q,k,v=(torch.randn(4,2048//d,4096,d,device="cuda",dtype=torch.bfloat16,requires_grad=True) for _ in range(3))
for _ in range(2): attnhub.attention(q,k,v,mask="causal" if c else None,backend="cuda").sum().backward()
torch.cuda.synchronize()'
  for args in "64 0" "128 0"; do
    tag=${args// /_}
    timeout 120 ncu --clock-control none -k regex:attn_bwd_d -s 2 -c 2 --section SpeedOfLight \
      --section WarpStateStats --section InstructionStats --section SourceCounters -o "$OUT/bwd_$tag" -f \
      python3 -c "$CASE" $args > /dev/null 2>&1
    ncu --import "$OUT/bwd_$tag.ncu-rep" --page details > "$OUT/bwd_$tag-details.txt" 2>&1
    ncu --import "$OUT/bwd_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/bwd_$tag-sass.csv" 2>&1
    echo "== ncu bwd $args"; grep -E "attn_bwd|Duration|Issued Ipc|Warp Cycles Per Issued" "$OUT/bwd_$tag-details.txt" | head -12
    rm -f "$OUT/bwd_$tag.ncu-rep"
  done
fi
date -u +"end %H:%M:%S UTC"
