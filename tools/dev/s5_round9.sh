#!/bin/bash
# Session 5, round 9 (H100): softcap backward tiles (dk/dv and dq kernels apart) at L 8k; decode
# with TMA descriptors for two tile configs, twice, against pointers. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r9
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
D="64,128,8,2"; Q="64,64,4,2"
BWD="$D/$Q;64,128,8,3/$Q;128,128,8,2/$Q;64,64,4,3/$Q;32,128,4,2/$Q;64,128,4,2/$Q;$D/64,64,4,3;$D/64,128,8,2;$D/128,128,8,2;$D/32,64,4,2;$D/64,32,4,2;$D/$Q"
timeout 200 python3 tools/dev/probe_s5.py --part softcap --lengths 8192 --fwd-cfgs "" --bwd-cfgs "$BWD" > "$OUT/softcap_bwd.log" 2>&1; echo "softcap rc=$?"
grep bwd "$OUT/softcap_bwd.log"
for tma in 0 3 0 3; do
ATTNHUB_TRITON_TMA=$tma timeout 100 python3 tools/dev/probe_s5.py --part decode --decode-cfgs "128,4,3;64,4,3;64,2,3" \
  --fills 4 --splits "" --shapes "4:8192,4:32768,1:8192" >> "$OUT/decode.log" 2>&1; echo "decode tma=$tma rc=$?"
done
