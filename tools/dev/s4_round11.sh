#!/bin/bash
# Session 4, round 11 (H100): the ragged forward at head dim 64 (Llama prefill shape): configs,
# pointer loads against forced TMA.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r11
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 200 python3 tools/dev/probe_s4.py --part d64 2>&1 | grep -v -i warn | tail -20
