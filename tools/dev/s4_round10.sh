#!/bin/bash
# Session 4, round 10 (H100): the Llama benchmark after the TMA ragged forward, host overhead.
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r10
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 60 python3 benchmarks/host_overhead.py > "$OUT/host.log" 2>&1; echo "host rc=$?"; grep -v -i warn "$OUT/host.log"
timeout 300 python3 benchmarks/hf_llama.py > "$OUT/hf.log" 2>&1; echo "hf rc=$?"; grep -v -i warn "$OUT/hf.log" | tail -6
