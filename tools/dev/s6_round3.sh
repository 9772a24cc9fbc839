#!/bin/bash
# Session 6, round 3 (H100): the ragged backward as shipped (hoisting reverted): per-kernel profile
# of the padding and varlen cases against a dense causal call, and the tile sweep.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r3
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 150 python3 tools/dev/probe_s6.py --part profile > "$OUT/profile.log" 2>&1
echo "profile rc=$?"; grep -v -i warn "$OUT/profile.log"
timeout 300 python3 tools/dev/probe_s6.py --part ragbwd --dkdv "64,128,8,2 128,128,8,2 64,128,4,2" --dq "128,64,8,2 64,64,4,3" > "$OUT/ragbwd.log" 2>&1
echo "ragbwd rc=$?"; grep -v -i warn "$OUT/ragbwd.log"
