#!/bin/bash
# Session 5, round 4 (H100): decode programs with TMA descriptor loads against pointer loads (the
# split policy's choice), bias forward per config and TMA setting. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r4
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
for tma in 0 3; do
ATTNHUB_TRITON_TMA=$tma timeout 200 python3 tools/dev/probe_s5.py --part decode --decode-cfgs "128,4,3;64,4,3;128,4,2;64,2,3" \
  --fills 4 --splits "" --shapes "4:8192,4:32768,1:8192,8:4096,r32:32768" > "$OUT/decode_tma$tma.log" 2>&1; echo "decode tma=$tma rc=$?"
done
timeout 150 python3 tools/dev/probe_s5.py --part biascfg --tmas 0,3 \
  --fwd-cfgs "128,128,8,3,0,1;128,64,8,3,0,1;128,64,8,3;64,64,4,3,0,1;64,64,4,3;128,64,8,2" > "$OUT/biascfg.log" 2>&1; echo "biascfg rc=$?"
cat "$OUT/biascfg.log"
