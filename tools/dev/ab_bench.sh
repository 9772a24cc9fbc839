#!/bin/bash
# A/B of the figure-of-record bench on one device machine, in one call: the tree in $BASELINE (an
# earlier commit's attnhub/, backends/, conformance/, pyproject.toml, copied there with git archive)
# against the working tree, same process order, same GPU.
#   bash tools/dev/ab_bench.sh            (BASELINE default .baseline; logs under $OUT)
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
BASELINE="${BASELINE:-.baseline}"
bench() {  # bench TAG: dense fwd+bwd against cuDNN and flash, then windows and decode against FlexAttention
  python3 -m attnhub.cli bench --backends triton,cuda --peers sdpa-cudnn,sdpa-flash --family dense \
    --direction fwd,bwd --lengths 4096,16384 --out "$OUT/$1-dense" > "$OUT/$1-dense.log" 2>&1
  echo "== $1 dense rc=$?"
  python3 -m attnhub.cli bench --backends triton,cuda --peers flex,sdpa-cudnn --family local,decode \
    --direction fwd --out "$OUT/$1-local" > "$OUT/$1-local.log" 2>&1
  echo "== $1 local/decode rc=$?"
}
for tag in old new; do
  src=.; [ "$tag" = old ] && src="$BASELINE"
  python3 -m pip install -q --no-deps --no-build-isolation -e "$src" > /dev/null 2>&1 || echo "install $tag failed"
  timeout 270 bash -c "$(declare -f bench); OUT=$OUT bench $tag"
done
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
