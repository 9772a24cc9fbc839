#!/bin/bash
# Session 5, round 2 (H100): decode configs x split fill and forced splits on uniform, small-batch
# and ragged caches; softcap forward with its new default tiles; the bias and softcap bench
# families (dbias batch sum in 16-bit). Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r2
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 240 python3 tools/dev/probe_s5.py --part decode --decode-cfgs "64,2,3;64,2,4;64,1,3;128,4,3;64,4,3" \
  --fills 1,2,4 --splits 3,4,6 --shapes "4:8192,4:16384,4:32768,1:8192,8:4096,r32:32768" > "$OUT/decode.log" 2>&1; echo "decode rc=$?"
timeout 100 python3 tools/dev/probe_s5.py --part softcap --fwd-cfgs "" --bwd-cfgs "64,128,8,2/64,64,4,2" > "$OUT/softcap.log" 2>&1; echo "softcap rc=$?"
timeout 200 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn,sdpa-efficient,flex --family bias,softcap \
  --out /tmp/bench-mod > "$OUT/bench_mod.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_mod.log" | grep -A6 "^case" | head -60
