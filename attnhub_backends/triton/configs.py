"""Tile shapes, warps and pipeline stages: small candidate sets per GPU family, a short tuner.

The first candidate of a set is the default, and a call uses it: a call compiles one config per
kernel, whatever its lengths (the shape class of ``shape.config_key`` has none). Tuning is explicit:
inside :func:`tuning` (``attnhub warmup --tune``), a request whose work is large enough compiles
each candidate, warms the GPU up, times each in two interleaved rounds of single calls from a cold
L2 cache (median of 5 to 32), keeps the fastest for its shape class and records it on disk for this
GPU and Triton version (``tuned.json`` under the cache directory). Calls use recorded picks where
they exist; ``ATTNHUB_TRITON_TUNE=0`` ignores them (first candidates only). Under the interpreter
one small shape is used (block shapes differ between query and key tiles to exercise the tile
plans).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass
from pathlib import Path

from attnhub import settings
from attnhub.errors import AttnhubError


@dataclass(frozen=True)
class Cfg:
    """Query tile rows ``bm``, key tile rows ``bn``, warps, software-pipelining stages; forward
    only: a register cap per thread (``maxnreg``, 0 = none) and the band walk (one loop over a
    contiguous run of key tiles, where the plan allows it)."""

    bm: int
    bn: int
    warps: int = 4
    stages: int = 2
    maxnreg: int = 0
    band: bool = False


INTERPRET = {"fwd": Cfg(32, 16, 1, 1), "dkdv": Cfg(16, 32, 1, 1), "dq": Cfg(32, 16, 1, 1)}


def _band(bm: int, bn: int, warps: int, stages: int, maxnreg: int = 0) -> Cfg:
    """A forward candidate with the band walk (a causal call's diagonal, a window's two edges and
    its unmasked run in one loop): faster than the index-list walk for causal calls at D = 128 but
    slower on D = 64 dense cases (docs/benchmarks.md), so the D = 64 dense list keeps the index-list
    walk (and 128 x 64 first: fastest or tied there)."""
    return Cfg(bm, bn, warps, stages, maxnreg, band=True)


# (kernel, head-dim bucket, element size) -> candidates; for Hopper (sm90) and Ampere/Ada alike,
# Hopper gets the deeper pipelines first. 16-bit lists start with what the tuner picked on the H100
# at every dense length (backward pairs checked with tools/dev/triton_bwd_probe.py; see
# docs/benchmarks.md), so that untuned calls and ties get the measured best.
_HOPPER: dict[tuple[str, int, int], list[Cfg]] = {
    ("fwd", 64, 2): [Cfg(128, 64, 4, 3), Cfg(64, 64, 4, 3), Cfg(128, 128, 8, 3), Cfg(128, 64, 4, 4)],
    ("fwd", 128, 2): [_band(128, 128, 8, 3), _band(128, 64, 8, 3), _band(64, 64, 4, 3)],
    ("fwd", 256, 2): [Cfg(64, 64, 4, 2), Cfg(128, 64, 8, 2), Cfg(64, 32, 4, 2)],
    ("fwd", 64, 4): [Cfg(64, 64, 4, 2), Cfg(64, 32, 4, 2), Cfg(128, 32, 8, 2)],
    ("fwd", 128, 4): [Cfg(64, 32, 4, 2), Cfg(64, 64, 8, 2), Cfg(32, 32, 4, 2)],
    ("fwd", 256, 4): [Cfg(32, 32, 4, 1), Cfg(64, 32, 8, 1), Cfg(32, 16, 4, 1)],
    ("dkdv", 64, 2): [Cfg(64, 64, 4, 3), Cfg(64, 128, 8, 3), Cfg(32, 128, 4, 3)],
    ("dkdv", 128, 2): [Cfg(64, 128, 8, 2), Cfg(64, 64, 4, 2), Cfg(32, 128, 4, 3)],
    ("dkdv", 256, 2): [Cfg(32, 64, 4, 1), Cfg(64, 64, 8, 1), Cfg(32, 32, 4, 1)],
    ("dkdv", 64, 4): [Cfg(32, 64, 4, 2), Cfg(32, 32, 4, 2)],
    ("dkdv", 128, 4): [Cfg(32, 64, 4, 1), Cfg(32, 32, 4, 2)],
    ("dkdv", 256, 4): [Cfg(16, 32, 4, 1), Cfg(32, 32, 8, 1)],
    # dq at D = 64: 64 x 64 x 4 warps, the tuner's pick on the H100 (2026-11-24: causal bwd 2.11 ms
    # against 2.30 with 128 x 64 x 8 at L = 4k, full level; tools/dev/round2.sh at 0dabcb3).
    ("dq", 64, 2): [Cfg(64, 64, 4, 3), Cfg(128, 64, 8, 3), Cfg(128, 32, 4, 3)],
    ("dq", 128, 2): [Cfg(64, 64, 4, 2), Cfg(128, 64, 8, 2), Cfg(128, 32, 4, 3)],
    ("dq", 256, 2): [Cfg(64, 32, 4, 1), Cfg(64, 64, 8, 1), Cfg(32, 32, 4, 1)],
    ("dq", 64, 4): [Cfg(64, 32, 4, 2), Cfg(32, 32, 4, 2)],
    ("dq", 128, 4): [Cfg(64, 32, 4, 1), Cfg(32, 32, 4, 2)],
    ("dq", 256, 4): [Cfg(32, 16, 4, 1), Cfg(32, 32, 8, 1)],
}


# Few query rows (decoding): 16-row tiles, long key tiles; split-KV spreads the keys over programs.
_SMALL_Q: dict[int, list[Cfg]] = {
    2: [Cfg(16, 128, 4, 3), Cfg(16, 64, 4, 4), Cfg(16, 256, 8, 3)],
    4: [Cfg(16, 64, 4, 2), Cfg(16, 32, 4, 3)],
}


# Boolean masks at head dim 128 (16-bit): the index-list walk. On the H100 the padded causal mask
# case (B 8, H 16, L 4k) ran 1.05 ms with 128 x 64 x 8 warps x 3 stages against 1.25 ms for the
# band walk that dense causal calls prefer there (tools/dev/probe_s3.py at 0dabcb3, part maskcfg).
_MASK_128 = [Cfg(128, 64, 8, 3), Cfg(64, 64, 4, 3)]


def mask_candidates(head_dim: int, elem_size: int, capability: tuple[int, int]) -> list[Cfg] | None:
    """Forward candidates for a boolean mask, or None where the dense list serves."""
    if elem_size != 2 or not 64 < head_dim <= 128:
        return None
    return _MASK_128 if capability[0] >= 9 else [_older(c) for c in _MASK_128]


def small_q_candidates(head_dim: int, elem_size: int) -> list[Cfg]:
    """Candidates for a forward with at most 16 query rows."""
    found = _SMALL_Q[4 if elem_size >= 4 else 2]
    if head_dim > 128:
        return [Cfg(c.bm, min(c.bn, 64), c.warps, min(c.stages, 2)) for c in found]
    return found


# Softcap (16-bit, head dim 128, full or causal): the per-score tanh (an exp2 and a reciprocal on
# top of the softmax's exp2) makes the forward bound by special functions, and 64 x 64 tiles with
# 4 warps keep more programs per SM to hide them. The index-list walk takes kernels._softcap_probs
# (four operations per score, only each row's max capped); the band walk keeps the general path
# (that helper under its runtime tile test broke Triton 3.6's pipeliner). H100, causal, B = 16k / L,
# H 16, L 4k / 8k / 16k: 0.771 / 1.481 / 3.026 ms against 0.829 / 1.600 / 3.058 for the band walk
# and 0.872 / 1.612 for 128 x 128 x 8 (tools/dev/s6_round7.sh at 0dabcb3, s6_round8.sh; 64 x 32, 64 x 128,
# 2 or 4 stages and register caps slower); with the bound as row max (shape.cap_max) 0.732 / 1.363 /
# 2.604 ms (s6_round12.sh). The backward keeps the dense pair (fastest there too).
_SOFTCAP_128 = [Cfg(64, 64, 4, 3), _band(64, 64, 4, 3), _band(128, 128, 8, 3)]


def softcap_candidates(head_dim: int, elem_size: int, capability: tuple[int, int]) -> list[Cfg] | None:
    """Forward candidates for a softcap request, or None where the dense list serves."""
    if elem_size != 2 or not 64 < head_dim <= 128:
        return None
    return _SOFTCAP_128 if capability[0] >= 9 else [_older(c) for c in _SOFTCAP_128]


# Sliding windows (16-bit, head dim <= 128), all with the band walk: 64-row query tiles waste fewer
# pairs at a window's edges than 128-row ones (which were slower on every case measured). At D = 64
# a 128-register cap lets four programs share an SM; 128 x 64 x 8 warps x 2 stages capped at 128
# registers also fits two per SM.
_LOCAL: dict[int, list[Cfg]] = {
    64: [_band(64, 64, 4, 3, 128), _band(64, 64, 4, 2, 128), _band(64, 64, 4, 3), _band(128, 64, 8, 2, 128)],
    128: [_band(64, 64, 4, 3), _band(64, 32, 4, 3), _band(128, 64, 8, 2, 128)],
}  # fmt: skip


# The ALiBi backward (16-bit, head dim 128, Hopper): three pipeline stages and FlexAttention's
# dq tile. H200, bfloat16, causal B 2, H 16, L 8k with ALiBi slopes (tools/dev/triton_bwd_probe.py
# --alibi at 22e893a): 3.788 ms against 4.329 with the dense pair (64 x 128 x 8 x 2, 64 x 64 x 4 x 2);
# dk/dv 64 x 128 x 8 x 3 with the dense dq 3.962, with dq 128 x 64 x 8 x 2 3.940. The dense lists
# keep their H100 picks until the dense grid is re-measured with these.
_ALIBI_BWD_128 = {
    "dkdv": [Cfg(64, 128, 8, 3), Cfg(64, 128, 8, 2)],
    "dq": [Cfg(128, 64, 8, 3), Cfg(64, 64, 4, 2)],
}


def alibi_backward_candidates(
    kernel: str, head_dim: int, elem_size: int, capability: tuple[int, int]
) -> list[Cfg] | None:
    """Backward candidates for a request with ALiBi slopes, or None where the dense list serves:
    Hopper only (where they were measured), the dense list after them as fallbacks."""
    if kernel not in _ALIBI_BWD_128 or elem_size != 2 or not 64 < head_dim <= 128 or capability[0] != 9:
        return None
    return list(
        dict.fromkeys([*_ALIBI_BWD_128[kernel], *candidates(kernel, head_dim, elem_size, capability)])
    )


def local_candidates(head_dim: int, capability: tuple[int, int]) -> list[Cfg]:
    """Forward candidates for a Local rule, 16-bit dtypes, head dim <= 128."""
    found = _LOCAL[64 if head_dim <= 64 else 128]
    if capability[0] < 9:
        found = list(dict.fromkeys(_older(c) for c in found))
    return found


#: The setting that pins each kernel's config.
CFG_SETTING = {
    "fwd": "ATTNHUB_TRITON_FWD_CFG",
    "dq": "ATTNHUB_TRITON_DQ_CFG",
    "dkdv": "ATTNHUB_TRITON_DKDV_CFG",
}


def forced(kernel: str) -> Cfg | None:
    """The kernel's ``CFG_SETTING`` (``bm,bn,warps,stages[,maxnreg[,band]]``) pins one config."""
    parts = settings.value(CFG_SETTING[kernel])
    if not parts:
        return None
    if not 4 <= len(parts) <= 6:
        raise AttnhubError(
            f"{CFG_SETTING[kernel]} takes bm,bn,warps,stages[,maxnreg[,band]] (4 to 6 integers), got "
            f"{settings.raw(CFG_SETTING[kernel])!r}"
        )
    return Cfg(*parts[:5], *(bool(x) for x in parts[5:]))


def _older(cfg: Cfg) -> Cfg:
    """Pre-Hopper parts have less shared memory: fewer stages."""
    return Cfg(cfg.bm, cfg.bn, cfg.warps, max(1, min(cfg.stages, 2)), cfg.maxnreg, cfg.band)


def candidates(kernel: str, head_dim: int, elem_size: int, capability: tuple[int, int]) -> list[Cfg]:
    """Candidate configs, default first, for a padded head dim and element size."""
    bucket = 64 if head_dim <= 64 else 128 if head_dim <= 128 else 256
    found = _HOPPER[(kernel, bucket, 4 if elem_size >= 4 else 2)]
    if capability[0] < 9:
        found = list(dict.fromkeys(_older(c) for c in found))
    return found


def tuning_enabled() -> bool:
    """Whether calls use the picks that tuning recorded (``ATTNHUB_TRITON_TUNE``, default on)."""
    return settings.value("ATTNHUB_TRITON_TUNE")


_TUNE_NOW = False


@contextlib.contextmanager
def tuning() -> Iterator[None]:
    """Inside: a shape class met for the first time is tuned (work permitting) and its pick
    recorded. Outside, calls never time candidates, so they never compile more than one config."""
    global _TUNE_NOW
    saved, _TUNE_NOW = _TUNE_NOW, True
    try:
        yield
    finally:
        _TUNE_NOW = saved


def records_path() -> Path:
    """``$ATTNHUB_CACHE_DIR/triton/tuned.json``, else under ``$XDG_CACHE_HOME/attnhub`` or
    ``~/.cache/attnhub``."""
    base = settings.value("ATTNHUB_CACHE_DIR")
    if not base:
        xdg = settings.external("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "attnhub")
    return Path(base) / "triton" / "tuned.json"


def _scope() -> str:
    """Recorded picks hold for one GPU model and one Triton version."""
    import torch
    import triton

    return f"{torch.cuda.get_device_name()} | triton {triton.__version__}"


_RECORDS: dict[str, dict[str, list]] | None = None


def _records() -> dict[str, dict[str, list]]:
    global _RECORDS
    if _RECORDS is None:
        try:
            _RECORDS = json.loads(records_path().read_text())
        except (OSError, ValueError):
            _RECORDS = {}
    return _RECORDS


def recorded(key: tuple) -> Cfg | None:
    """The pick that tuning recorded for ``key`` on this GPU, if any."""
    found = _records().get(_scope(), {}).get(repr(key))
    try:
        return Cfg(*found[:4], *found[4:5], *(bool(x) for x in found[5:6])) if found else None
    except TypeError:  # a record written by another version of this module
        return None


def _record(key: tuple, cfg: Cfg) -> None:
    path = records_path()
    try:
        on_disk = json.loads(path.read_text())
    except (OSError, ValueError):
        on_disk = {}
    on_disk.setdefault(_scope(), {})[repr(key)] = list(astuple(cfg))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(on_disk, indent=1, sort_keys=True))
    os.replace(tmp, path)
    global _RECORDS
    _RECORDS = on_disk


def bucket(n: int) -> int:
    """Power-of-two bucket of a size (window lengths in tuning keys)."""
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


_CHOSEN: dict[tuple, Cfg] = {}


def choose(
    key: tuple, cands: list[Cfg], run: Callable[[Cfg], object], work: int, persist: bool = False
) -> Cfg:
    """The config for the shape class ``key``: the recorded pick (``persist``: a GPU call) or the
    first candidate; inside :func:`tuning`, each candidate timed with ``run`` when ``work`` is large."""
    hit = _CHOSEN.get(key)
    if hit is not None:
        return hit
    if not _TUNE_NOW or work < (1 << 26) or len(cands) == 1:
        if persist and tuning_enabled() and (pick := recorded(key)) in cands:
            cands = [pick, *(c for c in cands if c != pick)]
        # The default, falling back to the next candidate if it does not compile.
        for cfg in cands:
            try:
                run(cfg)
            except Exception as exc:  # noqa: BLE001 - out of resources on this part
                if "OutOfResources" not in type(exc).__name__ and "resources" not in str(exc):
                    raise
                continue
            _CHOSEN[key] = cfg
            return cfg
        raise RuntimeError(f"no Triton config fits this GPU for {key}")
    live = []
    for cfg in cands:
        try:
            run(cfg)  # compile
        except Exception as exc:  # noqa: BLE001
            if "OutOfResources" not in type(exc).__name__ and "resources" not in str(exc):
                raise
            continue
        live.append(cfg)
    if not live:
        raise RuntimeError(f"no Triton config fits this GPU for {key}")
    # Bring the clocks up first (about 50 ms of the default): an idle GPU times its first candidate
    # slow, which biased the pick towards later candidates.
    ms = _elapsed_ms(lambda: run(live[0]), 1)
    _elapsed_ms(lambda: run(live[0]), max(1, min(200, math.ceil(50.0 / max(ms, 1e-3)))))
    best_of: dict[Cfg, float] = {}
    for _ in range(2):  # two interleaved rounds; each candidate keeps its better median
        for cfg in live:
            ms = _elapsed_ms(lambda c=cfg: run(c), 1)
            n = max(5, min(32, math.ceil(2.0 / max(ms, 1e-3))))
            best_of[cfg] = min(best_of.get(cfg, math.inf), _elapsed_ms(lambda c=cfg: run(c), n))
    best = min(live, key=lambda c: best_of[c])  # ties keep the candidates' order
    _CHOSEN[key] = best
    if persist:
        _record(key, best)
    return best


def _elapsed_ms(fn: Callable[[], object], n: int) -> float:
    """Median milliseconds of one call of ``fn`` over ``n`` calls, each timed alone with CUDA events.

    Before each call the L2 cache is flushed by zeroing a buffer four times its size (skipped if
    the GPU has no room for it), as ``triton.testing.do_bench`` does: the kernels start from a cold
    cache, and the flush keeps the GPU busy while the CPU issues the call, so launch overhead counts
    only where it exceeds the flush. Back-to-back batches (an earlier tuner) picked decode tiles
    that ``do_bench`` timed slower than another candidate.
    """
    import torch

    try:
        flush = torch.empty(_flush_bytes(), dtype=torch.int8, device="cuda")
    except torch.cuda.OutOfMemoryError:  # a nearly full GPU: time with a warm cache rather than fail
        flush = None
    events = []
    for _ in range(n):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]


def _flush_bytes() -> int:
    import torch

    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
    return 4 * max(int(l2), 32 << 20)


def chosen() -> dict[tuple, Cfg]:
    """The configs picked so far (for benchmark reports)."""
    return dict(_CHOSEN)
