#!/bin/bash
# Issue 25 on one GPU: the simulated ring against one call on the whole sequence (causal, L = 32k,
# D = 128, bf16, triton), where its time goes (kernel ms by kind: attention, merge, glue), then
# whether fusing Full steps into longer calls would pay (tools/dev/ring_fusion_probe.py), then the
# GPU tests of the ring. Logs under $OUT; at most about 235 s.   bash tools/dev/ring_sim_vs_one_call.sh
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
timeout 95 python3 benchmarks/ring_sim.py --backend triton --repeat 10 --worlds 2 4 \
  --json "$OUT/ring_sim.json" > "$OUT/ring_sim.log" 2>&1
echo "ring_sim rc=$?"; cat "$OUT/ring_sim.log"
timeout 40 python3 tools/dev/ring_sim_profile.py --backend triton --worlds 2 4 > "$OUT/profile.log" 2>&1
echo "profile rc=$?"; grep -E "wall|kernels|by kind" "$OUT/profile.log"
timeout 35 python3 tools/dev/ring_fusion_probe.py --backend triton --worlds 4 > "$OUT/fusion.log" 2>&1
echo "fusion probe rc=$?"; cat "$OUT/fusion.log"
timeout 55 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_distributed_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.log"
