#!/bin/bash
# Session 6, round 8 (H100): softcap forward tile sweep on the index-list walk (four operations per
# score), with a register cap where named; then the softcap bench family against FlexAttention.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r8
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 200 python3 tools/dev/probe_s5.py --part softcap --lengths 4096,8192 \
  --fwd-cfgs "64,64,4,3;64,64,4,2;64,128,4,3;64,128,4,2;64,32,4,3;64,64,4,3,128;64,64,4,3,168;128,128,8,3;128,64,4,3" \
  > "$OUT/softcap.log" 2>&1; echo "softcap rc=$?"; grep -v -i warn "$OUT/softcap.log" | grep -v bwd | tail -20
