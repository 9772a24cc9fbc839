"""``attnhub tune``: time the candidate backends on a grid of request classes and store a profile.

Each grid case (:mod:`attnhub.bench.grid`) is described as a torch request; every backend that can
run it (capability check, ``ATTNHUB_DISABLE``, no failing certification stored for this device) is
timed on random inputs through ``attnhub.attention(..., backend=NAME)``, forward alone or forward
and backward together for the cases that need gradients. The times land in the device's profile
(:mod:`attnhub.profile`), which ``backend="auto"`` then follows. :func:`measure_request` times one
request's candidates the same way (``ATTNHUB_AUTOTUNE``).

A candidate's cost on CUDA is max(GPU time per call, host time per call): the GPU time is
``triton.testing.do_bench``'s median (CUDA events around each call, the L2 cache flushed between
calls), which leaves out the Python and launch work that the host does per call; the host time is
the wall clock of a back-to-back loop of :data:`HOST_CALLS` calls, synchronized only before and
after, the fastest of :data:`HOST_ROUNDS` (:func:`host_ms`). A caller's loop of calls runs at the
slower of the two. The ``host`` family of the grid (small sizes, filed as sized classes) is timed
by the loop alone: such calls come in loops, where the loop's time per call (host and GPU work
overlapped, inputs warm in L2) is what a caller sees, and the flushed-cache GPU time overstates
some kernels there. The loop is skipped where the GPU time is at least
:data:`HOST_BOUND_MS` (no backend's host time comes near it). On the CPU the timed call's wall
clock already holds both (:func:`attnhub.bench.timing.cpu_timing`: the fastest of many calls after
a warm-up by count and by time).

A class whose fastest backend is not the highest-priority candidate is re-timed
(:func:`time_class`): the measurement overturns the declared priority only where the re-timing
confirms it. The profile records how each figure was measured.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnhub import profile
from attnhub.bench.grid import Case, default_grid, host_grid
from attnhub.bench.timing import FLUSH_BYTES
from attnhub.request import Request
from attnhub.rules import Causal, Full

DTYPES = ("bfloat16", "float16")
FAMILIES = ("dense", "local", "decode", "host")
#: do_bench warm-up and repetitions (ms) per device type.
TIMING = {"cuda": (25, 100), "cpu": (5, 20)}
#: Host time: calls per back-to-back loop (200 since 2026-11-28: the 21:21 re-tune on the H200
#: read 32 us a call at (8, 12, 512, 512) where tools/dev/host_path_breakdown.py read 23 with the
#: same function; longer loops leave a disturbed moment less weight), loops (the fastest counts),
#: and the GPU time (ms) from which on it is not measured.
HOST_CALLS, HOST_ROUNDS, HOST_BOUND_MS = 200, 5, 1.0
#: How a host-loop figure is measured, as the profile records it.
_HOST_LOOP = f"host loop (fastest of {HOST_ROUNDS} loops of {HOST_CALLS} calls, after one)"
_HOST_LOOP_INTERLEAVED = (
    f"host loop (fastest of {HOST_ROUNDS} loops of {HOST_CALLS} calls, after one; the candidates' "
    "loops in turn)"
)


#: The CPU grid, full and ``quick``: (head dim, heads, lengths, B·L).
CPU_GRID = {False: (64, 2, (128, 256, 512), 512), True: (32, 1, (64,), 64)}


def cpu_grid(quick: bool = False, dtype: str = "float32") -> list[Case]:
    """A small CPU grid (:data:`CPU_GRID`): full and causal, forward and forward+backward; D = 64,
    H = 2, B·L = 512, L in 128..512 (``quick``: D = 32, one head, L = 64, B = 1)."""
    dim, heads, lengths, tokens = CPU_GRID[quick]
    cases = []
    for direction in ("fwd", "fwdbwd"):
        for rule in (Full(), Causal()):
            for n in lengths:
                cases.append(
                    Case(
                        "dense",
                        max(1, tokens // n),
                        heads,
                        heads,
                        n,
                        n,
                        dim,
                        rule,
                        "none_front",
                        dtype,
                        direction,
                    )
                )
    return cases


def grid_summary(device: str, quick: bool) -> str:
    """One line saying what the tune grid of ``device`` ("cuda" or "cpu") holds, for ``--help``."""
    if device == "cpu":
        dim, heads, lengths, tokens = CPU_GRID[quick]
        return (
            f"full and causal, fwd and fwd+bwd, D={dim}, H={heads}, "
            f"L={'/'.join(map(str, lengths))}, B·L={tokens}"
        )
    if quick:
        return "D=128, L in 1k/4k, one window, one decode, the host-bound shapes"
    return "D in 64/128, L in 1k..16k, fwd and fwd+bwd, windows 256/1024, decode Lk 8k/32k, host-bound shapes"


def tune_grid(
    device: str = "cuda", quick: bool = False, dtypes: tuple[str, ...] | None = None, families=FAMILIES
) -> list[Case]:
    """The cases ``attnhub tune`` times: the bench grid (its backward cases timed as forward and
    backward together) and the host-bound cases (family "host") per dtype on CUDA, :func:`cpu_grid`
    on the CPU."""
    if device == "cpu":
        return [c for dt in dtypes or ("float32",) for c in cpu_grid(quick, dt)]
    cases = []
    for dt in dtypes or DTYPES:
        for c in default_grid(quick, dt) + host_grid(dt):
            if c.family in families:
                cases.append(replace(c, direction="fwdbwd") if c.direction == "bwd" else c)
    return cases


def case_class(case: Case, req: Request) -> tuple:
    """The profile class a case's times are filed under: sized for the host-bound family."""
    return profile.request_class(req, sized=case.family == "host")


def case_request(case: Case, device: str) -> Request:
    """The torch request a grid case makes (bhsd)."""
    from attnhub.shapes import request_from_shapes

    d = case.dim
    return request_from_shapes(
        (case.batch, case.heads_q, case.len_q, d),
        (case.batch, case.heads_kv, case.len_k, d),
        (case.batch, case.heads_kv, case.len_k, d),
        dtype=case.dtype,
        framework="torch",
        device=device,
        mask=case.rule,
        sync=case.sync,
        needs_grad=case.direction != "fwd",
    )


def candidates(req: Request, only: list[str] | None = None) -> list[str]:
    """The backends auto may pick for ``req``, in the prior's order (the dispatch order where
    nothing is measured), optionally only ``only``."""
    from attnhub.dispatch import _disabled, backend_reasons, prior_rank
    from attnhub.registry import REGISTRY

    disabled = _disabled()
    found = []
    for b in REGISTRY.backends().values():
        if only is not None and b.name not in only:
            continue
        if backend_reasons(b, req, disabled) or profile.certify_failure(b.name, req.device):
            continue
        found.append(b)
    return [b.name for b in sorted(found, key=lambda b: prior_rank(b, req))]


def _runner(name: str, case: Case) -> Callable[[Any, Any, Any], Any]:
    from attnhub.bench.runners import attnhub_forward

    return attnhub_forward(name, case)


@dataclass
class TuneResult:
    path: Path
    device: str
    classes: list[tuple[str, dict[str, float | None]]] = field(default_factory=list)


def _device_type(device: str) -> str:
    return device.split(":", 1)[0]


def time_candidates(
    case: Case,
    names: list[str],
    device: str,
    warmup: int | None = None,
    rep: int | None = None,
    how: dict[str, str] | None = None,
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Milliseconds per backend name on ``case`` (None where it failed, with the error): on CUDA
    max(GPU time, host time) per call (see the module docstring). One round, no re-timing
    (:func:`time_class` adds it); ``how``, if given, receives how each figure was measured."""
    from attnhub.bench.timing import time_case

    w, r = TIMING[_device_type(device)]
    times: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    notes: dict[str, str] = {}
    looped: list[str] = []  # the host family's backends, whose loops run interleaved below
    for name in names:
        res = time_case(name, case, _runner, warmup or w, rep or r, device=device)
        ms, note = res.ms, res.how or ""
        if ms is not None and _device_type(device) == "cuda" and ms < HOST_BOUND_MS:
            if case.family == "host":
                looped.append(name)
            else:
                loop = host_ms(name, case, device)
                ms, note = max(ms, loop), f"max of {note} and {_HOST_LOOP}"
        times[name] = None if ms is None else round(ms, 5)
        notes[name] = note
        if res.error:
            errors[name] = res.error
    if looped:
        # The host-bound family is filed for loops of small calls: their loop time decides (warm
        # L2, host and GPU overlapped), not do_bench's flushed-cache GPU time. The backends' loops
        # take turns, so that a slower stretch of the process weighs on them alike.
        for name, loop in host_loops(looped, case, device).items():
            times[name], notes[name] = round(loop, 5), _HOST_LOOP_INTERLEAVED
    if how is not None:
        for name in names:
            how[name] = notes[name] if times.get(name) is not None else f"failed: {errors.get(name)}"
    return times, errors


@dataclass
class ClassTimes:
    """A class's figures per backend (ms; None: failed), the errors, and how each was measured."""

    ms: dict[str, float | None]
    errors: dict[str, str]
    how: dict[str, str]
    #: False when a challenger the re-timing confirmed is not faster than the prior in every pair
    #: of their figures (its slower figure against the prior's faster one): the rounds disagree by
    #: more than the margin, so the order is noise. First-use measurement then records nothing.
    trusted: bool = True


def _clearly_faster(a: tuple, b: tuple) -> bool:
    """Every figure of ``a`` below every figure of ``b`` (None: failed)."""
    known_a, known_b = [t for t in a if t is not None], [t for t in b if t is not None]
    return bool(known_a) and bool(known_b) and max(known_a) < min(known_b)


def time_class(
    case: Case, names: list[str], device: str, warmup: int | None = None, rep: int | None = None
) -> ClassTimes:
    """Time ``names`` (the prior's order, as :func:`candidates` lists them) on ``case``,
    re-timing where the measurement would overturn that order.

    The *prior* is the first name that ran. Each backend that timed faster than it (a challenger)
    is timed again together with the prior. A challenger the re-timing confirms (faster than the
    prior again) keeps the better of its two figures, as does the prior; one it does not confirm
    keeps only its re-timed figure, which is no faster than the prior's, so ``auto`` keeps the
    priority order there: a single disturbed round (another process, a slow first call) can demote
    a backend, never promote one."""
    first_how: dict[str, str] = {}
    first, errors = time_candidates(case, names, device, warmup, rep, first_how)
    ms, how = dict(first), dict(first_how)
    ran = [n for n in names if first.get(n) is not None]
    if not ran:
        return ClassTimes(ms, errors, how)
    prior = ran[0]
    challengers = [n for n in ran[1:] if first[n] < first[prior]]
    if not challengers:
        return ClassTimes(ms, errors, how)
    again_how: dict[str, str] = {}
    again, again_errors = time_candidates(case, [prior, *challengers], device, warmup, rep, again_how)
    trusted = True
    ms[prior] = _better(first[prior], again[prior])
    how[prior] = f"{first_how[prior]}; re-timed: {_shown(again[prior])}; the better kept"
    for n in challengers:
        if again[n] is not None and (again[prior] is None or again[n] < again[prior]):
            trusted = trusted and _clearly_faster((first[n], again[n]), (first[prior], again[prior]))
            ms[n] = _better(first[n], again[n])
            how[n] = (
                f"{first_how[n]}; re-timed against {prior}: {_shown(again[n])}, confirmed; the better kept"
            )
        else:
            ms[n] = again[n]
            if n in again_errors:
                errors[n] = again_errors[n]
            how[n] = (
                f"{again_how[n]}; re-timing against {prior}, not confirmed: the first timing "
                f"({_shown(first[n])}) is dropped"
            )
    return ClassTimes(ms, errors, how, trusted)


def _better(a: float | None, b: float | None) -> float | None:
    """The smaller of two figures of one backend, ignoring a failed (None) one."""
    known = [t for t in (a, b) if t is not None]
    return min(known) if known else None


def _shown(ms: float | None) -> str:
    return "failed" if ms is None else f"{ms:.5g} ms"


def host_ms(name: str, case: Case, device: str, calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS) -> float:
    """Wall-clock ms per call of ``calls`` back-to-back calls of backend ``name`` on ``case``
    (forward, or forward and backward), synchronized only before and after; the fastest of
    ``rounds`` loops, after a warm-up loop."""
    return host_loops([name], case, device, calls, rounds)[name]


def host_loops(
    names: list[str], case: Case, device: str, calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS
) -> dict[str, float]:
    """:func:`host_ms` of each of ``names``, their loops taking turns (a warm-up loop each, then
    ``rounds`` rounds of one loop each): in one ``attnhub tune`` process on the H200 the same
    backend's loop read 22 us a call and, minutes later, 36 (2026-11-28), so loops timed one
    backend after another can order the backends by when they ran."""
    import time

    import torch

    from attnhub.bench.runners import make_inputs

    q, k, v, do = make_inputs(case, device)
    fns = {name: _runner(name, case) for name in names}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step(fn: Callable[[Any, Any, Any], Any]) -> Any:
        if case.direction == "fwd":
            return fn(q, k, v)
        for x in (q, k, v):
            x.grad = None
        return fn(q, k, v).backward(do)

    best = dict.fromkeys(names, float("inf"))
    # Forward cases run under no_grad as time_case runs them (entered once: not a per-call cost).
    with torch.no_grad() if case.direction == "fwd" else contextlib.nullcontext():
        for i in range(rounds + 1):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                fn = fns[name]
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    step(fn)
                sync()
                if i:  # the first round warms up
                    best[name] = min(best[name], (time.perf_counter() - t0) * 1e3 / calls)
    return best


def tune(
    device: str = "cuda",
    *,
    quick: bool = False,
    dtypes: tuple[str, ...] | None = None,
    families: tuple[str, ...] = FAMILIES,
    backends: list[str] | None = None,
    out: str | Path | None = None,
    warmup: int | None = None,
    rep: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> TuneResult:
    """Time the candidate backends on the tune grid of ``device`` ("cuda" or "cpu", torch tensors)
    and write the profile: the user's for this device (``<cache dir>/profiles/``), or ``out``.

    Returns the path written and, per class, the times. Needs torch (and a CUDA GPU for "cuda").
    """
    import torch

    if device != "cpu" and not device.startswith("cuda"):
        raise RuntimeError(f"attnhub tune runs on cpu or cuda[:N], not {device!r}")
    if device != "cpu" and not torch.cuda.is_available():
        raise RuntimeError("attnhub tune on cuda needs a CUDA GPU (torch.cuda.is_available() is False)")
    dev = "cpu" if device == "cpu" else (device if ":" in device else f"cuda:{torch.cuda.current_device()}")
    key = profile.device_key(dev)
    if key is None:
        raise RuntimeError(f"cannot describe device {dev!r} for a profile")
    if dev.startswith("cuda"):
        torch.cuda.set_device(dev)
    say = progress or (lambda line: None)
    cases = tune_grid(_device_type(dev), quick, dtypes, families)
    found: list[tuple[tuple, dict[str, float | None], str, dict[str, str]]] = []
    result = TuneResult(Path(), key)
    for i, case in enumerate(cases, 1):
        req = case_request(case, dev)
        names = candidates(req, backends)
        if not names:
            say(f"[{i}/{len(cases)}] {case.label()}: no candidate")
            continue
        timed = time_class(case, names, dev, warmup, rep)
        times, errors = timed.ms, timed.errors
        cls = case_class(case, req)
        found.append((cls, times, case.label(), timed.how))
        result.classes.append((profile.class_text(cls), times))
        cells = ", ".join(
            f"{n} {t:.3f} ms" if t is not None else f"{n} failed ({errors.get(n, '?')})"
            for n, t in times.items()
        )
        say(f"[{i}/{len(cases)}] {case.label()}: {cells}")
    meta = {
        "command": " ".join(["attnhub", "tune", *sys.argv[2:]])
        if sys.argv[1:2] == ["tune"]
        else "attnhub.tune()",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    result.path = profile.record(key, found, meta, Path(out) if out is not None else None)
    return result


# --- measuring on first use (ATTNHUB_AUTOTUNE) ---------------------------------------------------


_tried: set[tuple] = set()


def can_measure(req: Request) -> bool:
    """Whether :func:`measure_request` can time ``req``: concrete torch inputs, a rule (no mask
    array), not inside torch.compile or CUDA graph capture, and on a GPU room for the timing's
    fresh inputs (:func:`fits`)."""
    if req.framework != "torch" or req.symbolic or req.is_empty or req.ndim != 1:
        return False
    if type(req.rule).__name__ == "ExplicitMask":
        return False
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if torch.compiler.is_compiling():
            return False
        if req.device_type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
    except Exception:
        return False
    if req.device_type == "cuda":
        free = _free_bytes(req.device)
        if free is None or not fits(req, free):
            return False
    return True


#: First use under ``ATTNHUB_AUTOTUNE=auto``: CUDA requests of at least this many FLOPs (forward;
#: 3.5× with gradients), about 50 µs at 500 TFLOP/s. Shorter calls come in loops whose time is the
#: host's, where the prior (the vendor kernel) is already the right pick, and their first-use timing
#: would cost more than a whole run of them gains.
FIRST_USE_MIN_FLOPS = 2.5e10


def worth_measuring(req: Request, mode: str) -> bool:
    """Whether ``auto`` times ``req``'s class on first use under ``ATTNHUB_AUTOTUNE=mode``."""
    if mode == "on":
        return True
    if mode != "auto" or req.device_type != "cuda":
        return False
    return req.flops >= FIRST_USE_MIN_FLOPS


_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def timing_bytes(req: Request) -> int:
    """Device memory a timing of ``req`` allocates at most: fresh q, k, v and out (their
    gradients too when it needs them), plus as much again for a backend's workspace (its lse,
    saved tensors, split-KV partials)."""
    per = _BYTES.get(req.dtype, 8)
    q = req.batch * req.heads_q * req.nq * req.dim_qk
    kv = req.batch * req.heads_kv * req.nk * (req.dim_qk + req.dim_v)
    out = req.batch * req.heads_q * req.nq * req.dim_v
    arrays = (q + kv + out) * per * (2 if req.needs_grad else 1)
    return 2 * arrays


def fits(req: Request, free_bytes: int) -> bool:
    """Whether a first-use timing of ``req`` (its arrays and do_bench's L2 flush buffer) fits in
    ``free_bytes`` with as much again to spare: timing must never make a call that fits run out of
    memory."""
    return 2 * (timing_bytes(req) + FLUSH_BYTES) <= free_bytes


def _free_bytes(device: str) -> int | None:
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    except Exception:
        return None


def measure_request(req: Request, names: list[str]) -> Path | None:
    """Time ``names`` on fresh random inputs of ``req``'s shapes (never the caller's arrays) and add
    the class to the user's profile; the path written, or None when it could not be measured."""
    key = profile.device_key(req.device)
    if key is None or not can_measure(req):
        return None
    # Filed as a sized class (B·Hq too): one request's times decide only for requests near its size,
    # never for a much larger (or smaller) batch of the same lengths, which is timed on its own.
    cls = profile.request_class(req, sized=True)
    tried = (key, cls)
    if tried in _tried:  # measured before in this process without a usable result
        return None
    _tried.add(tried)
    case = Case(
        "dense",
        req.batch,
        req.heads_q,
        req.heads_kv,
        req.nq,
        req.nk,
        req.dim_qk,
        req.rule,
        req.sync,
        req.dtype,
        "fwdbwd" if req.needs_grad else "fwd",
    )
    if req.dim_v != req.dim_qk:
        return None
    timed = time_class(case, names, req.device)
    if all(t is None for t in timed.ms.values()) or not timed.trusted:
        return None  # nothing usable, or a disturbed machine: the prior decides, nothing is kept
    meta = {"command": "ATTNHUB_AUTOTUNE (measured on first use)"}
    return profile.record(key, [(cls, timed.ms, profile.FIRST_USE + case.label(), timed.how)], meta)
