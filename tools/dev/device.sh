#!/bin/bash
# One run on a machine with an NVIDIA GPU, from the repository root:
#
#   bash tools/dev/device.sh STAGE...        (no stage: install tests certify-quick)
#
# Stages (each under `timeout`; its log goes to $OUT/<stage>.log, one summary line is printed per
# stage and all of them again at the end; the exit status is non-zero when a stage failed):
#   install        pip install -e . without dependencies; GPU, driver, torch / triton / cuda versions
#   precompile     NVRTC-compile the cuda backend's kernels for $ARCH into the kernel cache
#   tests          the GPU-marked tests (pytest -m gpu) of $TEST_FILES (default: all of tests/)
#   certify-quick  `attnhub certify NAME --quick --device cuda` for each of $BACKENDS
#   certify        the full `attnhub certify NAME --device cuda -j $JOBS` for each of $BACKENDS
#   bench          the figures of record: `attnhub bench` of $BENCH_BACKENDS against SDPA flash and
#                  cuDNN (dense, forward and backward, L = 4k-16k), then local windows and decode
#                  forward with FlexAttention among the peers
#   bench32        the cuda backend's float32 forward against SDPA math (dense, L = 4k)
#   probe          tools/dev/probe_fwd.py $PROBE_STEPS (triton forward variants against the peers)
#
# Environment: OUT (default ./gpu-out), BACKENDS (default "triton cuda"), BENCH_BACKENDS (default
# triton,cuda), JOBS (default 16), SEED (certify), ARCH (default sm_90), PROBE_STEPS (default
# "check dense local"), TIMEOUT_<STAGE> in seconds (e.g. TIMEOUT_CERTIFY=600).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
BACKENDS="${BACKENDS:-triton cuda}"
BENCH_BACKENDS="${BENCH_BACKENDS:-triton,cuda}"
JOBS="${JOBS:-16}"
ARCH="${ARCH:-sm_90}"
PY="${PYTHON:-python3}"
ATTNHUB=("$PY" -m attnhub.cli)
STAGES=("$@"); [ ${#STAGES[@]} -eq 0 ] && STAGES=(install tests certify-quick)

# Parallel pytest workers when pytest-xdist is installed.
xdist() { "$PY" -c "import xdist" 2>/dev/null && echo "-n $JOBS"; }

# limit STAGE SECONDS: $TIMEOUT_<STAGE> or SECONDS.
limit() { local var="TIMEOUT_$(echo "$1" | tr 'a-z-' 'A-Z_')"; echo "${!var:-$2}"; }

stage_install() {
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || return
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
  "$PY" - <<'PY'
import importlib
for m in ("torch", "triton", "jax", "cuda.core", "cuda.bindings"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as exc:
        print(m, "unavailable:", type(exc).__name__)
PY
  git log --oneline -1 2>/dev/null
  "${ATTNHUB[@]}" info --no-errors
}

stage_precompile() {
  "$PY" -m attnhub_backends.cuda.precompile "$ARCH"
}

stage_tests() {
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -m gpu $(xdist) -p no:cacheprovider ${TEST_FILES:-tests/}
}

stage_certify_quick() {
  local rc=0 name
  for name in $BACKENDS; do
    "${ATTNHUB[@]}" certify "$name" --quick --device cuda --report "$OUT/$name-gpu-quick" || rc=1
  done
  return $rc
}

stage_certify() {
  local rc=0 name seed=()
  [ -n "${SEED:-}" ] && seed=(--seed "$SEED")
  for name in $BACKENDS; do
    "${ATTNHUB[@]}" certify "$name" --device cuda -j "$JOBS" "${seed[@]}" --report "$OUT/$name-gpu-full" || rc=1
  done
  return $rc
}

stage_bench() {
  "${ATTNHUB[@]}" bench --backends "$BENCH_BACKENDS" --peers sdpa-flash,sdpa-cudnn --family dense \
    --direction fwd,bwd --lengths 4096,8192,16384 --out "$OUT/bench-dense" || return
  "${ATTNHUB[@]}" bench --backends "$BENCH_BACKENDS" --peers flex,sdpa-flash,sdpa-cudnn --family local,decode \
    --direction fwd --out "$OUT/bench-local-decode"
}

stage_bench32() {
  "${ATTNHUB[@]}" bench --backends cuda --peers sdpa-math --dtype float32 --family dense --direction fwd \
    --lengths 4096 --out "$OUT/bench-f32"
}

stage_probe() {
  # shellcheck disable=SC2086
  "$PY" tools/dev/probe_fwd.py ${PROBE_STEPS:-check dense local}
}

# The line of a stage's log worth printing in its summary.
gist() {
  case "$1" in
    install) grep -m1 -E "," "$2" ;;
    tests) grep -E "passed|failed|error" "$2" | tail -1 ;;
    certify*) grep -E "cases:" "$2" | tr '\n' ';' ;;
    bench*) grep -c -E "TFLOP/s" "$2" | sed 's/$/ timings/' ;;
    probe) grep -c -E "^RES" "$2" | sed 's/$/ results/' ;;
    *) tail -1 "$2" ;;
  esac
}

declare -A DEFAULT_LIMIT=(
  [install]=300 [precompile]=300 [tests]=600 [certify-quick]=600 [certify]=1200
  [bench]=900 [bench32]=300 [probe]=600
)
summary=(); failed=0
date -u +"start %Y-%m-%d %H:%M:%S UTC"
for stage in "${STAGES[@]}"; do
  fn="stage_${stage//-/_}"
  if ! declare -F "$fn" > /dev/null; then
    line="$stage: unknown stage (install precompile tests certify-quick certify bench bench32 probe)"
    echo "== $line"; summary+=("$line"); failed=1
    continue
  fi
  log="$OUT/$stage.log"; t0=$(date +%s)
  # The stage runs in a child bash so that `timeout` can end it and everything it started.
  export -f "$fn" xdist; export PY JOBS ARCH OUT BACKENDS BENCH_BACKENDS SEED PROBE_STEPS
  timeout "$(limit "$stage" "${DEFAULT_LIMIT[$stage]}")" bash -c "ATTNHUB=(\"\$PY\" -m attnhub.cli); $fn" \
    > "$log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && failed=1
  [ $rc -eq 124 ] && note="TIMED OUT" || note="$(gist "$stage" "$log")"
  line="$stage rc=$rc $(( $(date +%s) - t0 ))s: $note"
  echo "== $line"
  summary+=("$line")
done
date -u +"end %Y-%m-%d %H:%M:%S UTC"
printf '%s\n' "${summary[@]}"
exit $failed
