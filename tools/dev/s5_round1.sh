#!/bin/bash
# Session 5, round 1 (H100): dbias batch sum, decode split fill per cache length, softcap tanh
# formulations and tiles (tools/dev/probe_s5.py). Logs under $OUT.
set -u
export ATTNHUB_CACHE_DIR=/tmp/attnhub-cache
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
timeout 60 python3 tools/dev/probe_s5.py --part bias > "$OUT/bias.log" 2>&1; echo "bias rc=$?"
timeout 150 python3 tools/dev/probe_s5.py --part decode > "$OUT/decode.log" 2>&1; echo "decode rc=$?"
FWD="128,128,8,3,0,1;128,64,8,3,0,1;64,64,4,3,0,1;128,64,8,2,0,1;128,128,8,2,0,1"
BWD="64,128,8,2/64,64,4,2;64,64,4,2/64,64,4,2;64,128,8,2/128,64,8,2"
for t in base newton approx; do
  timeout 170 python3 tools/dev/probe_s5.py --part softcap --tanh $t --fwd-cfgs "$FWD" --bwd-cfgs "$BWD" > "$OUT/softcap_$t.log" 2>&1; echo "softcap $t rc=$?"
done
