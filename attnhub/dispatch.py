"""Choosing a backend for a request: overrides, capability checks, measured times or priority, and
certification verdicts (:mod:`attnhub.profile`), through one bounded cache."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from attnhub import profile, settings
from attnhub.backend import Backend
from attnhub.errors import BackendUnsupported, NoBackendError
from attnhub.registry import REGISTRY
from attnhub.request import Request
from attnhub.rules import Causal, Full

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnhub_backend", default=None)


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Within the block, ``backend="auto"`` means ``name`` (an explicit ``backend=`` still wins)."""
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


_backend_env = settings.key_reader("ATTNHUB_BACKEND")
_disable_env = settings.key_reader("ATTNHUB_DISABLE")


def override_state() -> tuple:
    """What besides the request decides the choice: use_backend and the two environment variables
    (their raw values: read on every call, so C-level reads and no parsing)."""
    return (_forced.get(), _backend_env(), _disable_env())


def _disabled() -> frozenset[str]:
    return settings.value("ATTNHUB_DISABLE")


@dataclass
class Verdict:
    """Why one backend was or was not chosen."""

    name: str
    priority: int
    reasons: list[str]
    chosen: bool = False
    #: How the backend would run the request (``Backend.note``), for backends that can run it.
    note: str | None = None
    #: Its time on the request's class in this device's profile (ms), when measured.
    measured_ms: float | None = None


@dataclass
class Explanation:
    """Result of :func:`attnhub.explain`: the chosen backend name and every backend's verdict."""

    request: Request
    mode: str
    chosen: str | None
    verdicts: list[Verdict] = field(default_factory=list)
    #: The profile measurements that ordered the candidates (None: the prior decided).
    measured: profile.Measured | None = None
    #: The candidates in the order auto tries them (the chosen one first).
    order: list[str] = field(default_factory=list)
    #: The measured class lacks a candidate the prior puts first (a vendor kernel that could not
    #: run the request when the class was measured): a first-use measurement completes it.
    incomplete: bool = False

    @property
    def basis(self) -> str:
        """Where the choice comes from: "shipped profile", "first-use measurement", "user
        profile" or "prior"."""
        return "prior" if self.measured is None else self.measured.origin

    def __str__(self) -> str:
        lines = [f"request: {self.request.describe()}", f"mode: {self.mode}"]
        if self.measured is not None:
            lines.append(f"order: by {self.measured.describe()}")
            if self.incomplete:
                lines.append(
                    f"  (the class lacks {', '.join(self._unmeasured())}: measured on first use where it applies)"
                )
        else:
            lines.append(
                f"order: by the prior ({PRIOR_TEXT}; no measured class for this request on this device)"
            )
        width = max([len(v.name) for v in self.verdicts] + [7])
        lines.append(f"{'backend':<{width}}  prio  verdict")
        for v in self.verdicts:
            timed = f"measured {v.measured_ms:.3f} ms" if v.measured_ms is not None else None
            if v.chosen:
                verdict = f"CHOSEN ({timed})" if timed else "CHOSEN"
            elif not v.reasons:
                if timed:
                    verdict = f"can run it ({timed})"
                elif self.measured is not None:
                    verdict = "can run it (not measured)"
                else:
                    verdict = "can run it (later in the prior's order)"
            else:
                verdict = "; ".join(v.reasons)
            if v.note and not v.reasons:
                verdict += f" ({v.note})"
            lines.append(f"{v.name:<{width}}  {v.priority:>4}  {verdict}")
        lines.append(f"chosen: {self.chosen or 'none'} (by {self.basis})")
        return "\n".join(lines)

    def _unmeasured(self) -> list[str]:
        return [v.name for v in self.verdicts if not v.reasons and v.measured_ms is None]


#: The prior, in words (explain's output and docs/dispatch.md).
PRIOR_TEXT = (
    "vendor kernels first for plain dense requests (the lightest-call one for small calls, one with "
    "heavier calls only for large ones), then declared priority"
)


def plain(req: Request) -> bool:
    """A dense request vendor kernels are built for: the rule Full or Causal (any sync) and no
    SPEC §9-§11 argument (bias, softcap, sinks, lengths, packed or paged keys, offsets)."""
    return isinstance(req.rule, (Full, Causal)) and not req.modified


#: Plain calls below this many FLOPs (``Request.flops``) run at the host's pace in a loop: the
#: prior tries the vendor kernel with the lightest calls first (``Backend.light_calls``). On the
#: H100 and H200 that picks the fastest loop at (1, 8, 1, 512) and (1, 8, 128, 128), D 64
#: (2·10^7 FLOPs and less), and leaves (8, 12, 512, 512) (3·10^9) to cuDNN.
SMALL_CALL_FLOPS = 1e9


def prior_rank(b: Backend, req: Request) -> int:
    """The prior's bucket of ``b`` for ``req`` (lower first; priority orders within a bucket):
    vendor kernels lead for :func:`plain` requests (the lightest-call one first for calls under
    :data:`SMALL_CALL_FLOPS` where its call for the request is light, ``Backend.light_call``; one
    with heavier calls after the others below its ``heavy_calls_from``), own kernels for everything
    else, where only they compute the request natively (masks, biases, lengths and the rest)."""
    if not (b.vendor and plain(req)):
        return 3
    if b.light_calls and req.flops < SMALL_CALL_FLOPS and getattr(b, "light_call", lambda r: True)(req):
        return 0
    return 2 if req.flops < b.heavy_calls_from else 1


def _mode(backend: str) -> tuple[str, str | None]:
    """('explicit', name), ('forced', name) from use_backend/ATTNHUB_BACKEND, or ('auto', None)."""
    if backend != "auto":
        return "explicit", backend
    forced = _forced.get()
    if forced:
        return "use_backend", forced
    env = settings.value("ATTNHUB_BACKEND")
    if env and env != "auto":
        return "ATTNHUB_BACKEND", env
    return "auto", None


#: Why every backend without the "dbias" feature declines a differentiated float mask.
DBIAS_REASON = "cannot compute the gradient of a float mask/bias (SPEC §9)"


def backend_reasons(
    b: Backend, req: Request, disabled: frozenset[str], named: bool = True, late: bool = True
) -> list[str]:
    """Every reason ``b`` cannot serve ``req`` (empty: it can); with ``late=False`` all but the
    costly probe's (:meth:`Backend.late_reasons`, see :func:`late_reasons`).

    ``named=False`` (a backend auto weighs but the caller did not name) declines one for another
    device type from its declaration, without probing its availability (a driver lookup, finding
    a package) on every plan; a named backend's availability comes first, as it says what to fix.

    A backend's ``availability()`` or ``check()`` that raises makes that backend unavailable for
    the request, with the error as the reason; it never takes dispatch down for the others.
    """
    if b.name in disabled:
        return ["disabled by ATTNHUB_DISABLE"]
    if req.framework not in b.frameworks:
        # Decided from the declaration alone: no need to probe (and import) the backend's framework.
        return [f"takes {', '.join(b.frameworks) or 'no'} arrays, got a {req.framework} array"]
    if not named and req.device_type not in b.device_types:
        return [b.device_reason(req)]
    try:
        why = b.availability()
    except Exception as exc:
        return [f"unavailable: availability() raised {type(exc).__name__}: {exc}"]
    if why:
        return [f"unavailable: {why}"]
    try:
        reasons = list(b.check(req))
    except Exception as exc:
        return [f"check() raised {type(exc).__name__}: {exc}"]
    # Checked here, not in Backend.check, so that a backend overriding check() cannot forget it.
    if req.bias_grad and not req.is_empty and "dbias" not in b.features:
        reasons.append(DBIAS_REASON)
    if late and not reasons:
        return late_reasons(b, req)
    return reasons


def late_reasons(b: Backend, req: Request) -> list[str]:
    """``b.late_reasons(req)`` (none for a plugin without the method); one that raises makes the
    backend unavailable for the request, with the error as the reason."""
    probe = getattr(b, "late_reasons", None)
    if probe is None:
        return []
    try:
        return list(probe(req))
    except Exception as exc:
        return [f"late_reasons() raised {type(exc).__name__}: {exc}"]


def certify_reason(path: str) -> str:
    return f"failed certification on this device (report {path}); auto never picks it"


def explain_request(req: Request, backend: str = "auto", probe_all: bool = False) -> Explanation:
    """Evaluate every registered backend for ``req`` and say which one runs it.

    In auto mode a backend whose stored certification report for this device has a failing case
    is declined; the others that can run the request are tried fastest first when this device's
    profile has a class near the request's (:func:`attnhub.profile.lookup`), a measured backend
    before every unmeasured one, else (and among the unmeasured) in the prior's order
    (:func:`prior_rank`, then declared priority). The costly probes (:func:`late_reasons`) run
    down that order only until one candidate passes, unless ``probe_all`` (``explain``).
    """
    mode, name = _mode(backend)
    disabled = _disabled()
    table = REGISTRY.backends()
    verdicts = [
        Verdict(
            b.name,
            b.priority,
            backend_reasons(b, req, disabled, named=b.name == name, late=probe_all or b.name == name),
        )  # fmt: skip
        for b in table.values()
    ]
    runnable = [v for v in verdicts if not v.reasons]
    measured = profile.lookup(req) if runnable else None
    if measured is not None:
        for v in runnable:
            v.measured_ms = measured.ms.get(v.name)
    chosen: str | None = None
    if name is not None:
        if name not in table:
            verdicts.append(Verdict(name, 0, ["no backend of that name is registered"]))
        else:
            v = next(v for v in verdicts if v.name == name)
            chosen = name if not v.reasons else None
    else:
        for v in runnable:
            failed = profile.certify_failure(v.name, req.device)
            if failed is not None:
                v.reasons.append(certify_reason(failed))
        ranks = {v.name: prior_rank(table[v.name], req) for v in runnable}
        order = measured_order([v for v in runnable if not v.reasons], ranks)
        if req.nq <= DECODE_ROWS:  # a decode step: a new shape every step (Backend.builds_per_shape)
            order.sort(key=lambda v: bool(getattr(table[v.name], "builds_per_shape", False)))
        if not probe_all:  # the first candidate whose costly probe passes; later ones unprobed
            while order and (late := late_reasons(table[order[0].name], req)):
                order.pop(0).reasons.extend(late)
        chosen = order[0].name if order else None
        # A measured class that lacks a vendor kernel the prior puts first (one that could not run
        # the request when the class was measured, e.g. bfloat16 gradients before 2026-11-28).
        incomplete = measured is not None and any(v.measured_ms is None and ranks[v.name] < 2 for v in order)
        return _finish(req, mode, chosen, verdicts, measured, table, [v.name for v in order], incomplete)
    return _finish(req, mode, chosen, verdicts, measured, table, [chosen] if chosen else [], False)


#: Requests with at most this many query rows are decode steps, whose key count grows every step:
#: backends that build a plan per shape (``Backend.builds_per_shape``) go last for them. H200, GQA
#: 32/8, D 64, a cache one key longer each step: torch's cuDNN SDPA 2.4-3.8 ms a call, sdpa-flash
#: 47-76 us (tools/dev/decode_new_shapes.py, docs/benchmarks.md).
DECODE_ROWS = 16

#: Measured times within this fraction of the fastest are a tie, which the prior orders: the same
#: kernel timed twice (cudnn and sdpa-cudnn) differs by more than that from one run to the next.
MEASURED_TIE = 0.03


def measured_order(candidates: list[Verdict], ranks: dict[str, int]) -> list[Verdict]:
    """Measured candidates first: those within :data:`MEASURED_TIE` of the fastest in the prior's
    order (bucket, then priority), the others fastest first; then the unmeasured in the prior's
    order. The sort is stable, so declared priority orders what compares equal."""
    times = [v.measured_ms for v in candidates if v.measured_ms is not None]
    tie = min(times) * (1 + MEASURED_TIE) if times else 0.0

    def key(v: Verdict) -> tuple:
        if v.measured_ms is None:
            return (2, ranks[v.name], 0.0)
        if v.measured_ms <= tie:
            return (0, ranks[v.name], 0.0)
        return (1, 0, v.measured_ms)

    return sorted(candidates, key=key)


def _finish(req, mode, chosen, verdicts, measured, table, order, incomplete) -> Explanation:
    for v in verdicts:
        v.chosen = v.name == chosen
        if not v.reasons and v.name in table:
            v.note = backend_note(table[v.name], req)
    return Explanation(req, mode, chosen, verdicts, measured, order, incomplete)


def backend_note(b: Backend, req: Request) -> str | None:
    """``b.note(req)``; a note that raises never takes ``explain`` down."""
    try:
        return b.note(req)
    except Exception as exc:
        return f"note() raised {type(exc).__name__}: {exc}"


class DispatchCache:
    """The one dispatch cache: ``attention``'s plans by raw call signature and
    :meth:`Dispatcher.choose`'s backends by request, each keyed with :func:`override_state`.

    Bounded: at most ``maxsize`` entries, in two generations of ``maxsize // 2``. A new entry goes
    into the recent generation; when that is full it becomes the old one and the former old one is
    dropped; a hit in the old generation moves the entry back into the recent one. So an entry used
    within the last ``maxsize // 2`` insertions stays (least recently used go first), and a hit on a
    recent entry costs one dict lookup (``cache.recent.get(key)``) with no bookkeeping. Dropping an
    entry is always safe: the next call with that signature dispatches again.

    Thread-safe: lookups read plain dicts; insertions, promotions and generation changes take a lock.
    """

    def __init__(self, maxsize: int = 4096) -> None:
        if maxsize < 2:
            raise ValueError(f"maxsize must be at least 2, got {maxsize}")
        self.maxsize = maxsize
        self._half = maxsize // 2
        #: The recent generation; read it directly on a hot path, then fall back to :meth:`get`.
        self.recent: dict[Any, Any] = {}
        self._old: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.recent) + len(self._old)

    def get(self, key: Any) -> Any:
        """The entry for ``key`` or None; a hit in the old generation moves it into the recent one."""
        hit = self.recent.get(key)
        if hit is None:
            hit = self._old.get(key)
            if hit is not None:
                self.put(key, hit)
        return hit

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            if key not in self.recent and len(self.recent) >= self._half:
                self._old, self.recent = self.recent, {}
            self.recent[key] = value

    def clear(self) -> None:
        with self._lock:
            self.recent, self._old = {}, {}


#: The process's dispatch cache, dropped whenever the set of registered backends may have changed.
CACHE = DispatchCache()
REGISTRY.on_reset.append(CACHE.clear)
profile.on_reload.append(CACHE.clear)


#: ``measure(req, exp) -> exp``: first-use measurement of a class the profile lacks, which may
#: time the candidates and record them, then explain again. The dispatcher times nothing itself:
#: attnhub/first_use.py is wired in at the package root (attnhub/__init__.py).
Measure = Callable[[Request, Explanation], Explanation]


def _next_step(req: Request) -> str:
    """What a user can do about a request no backend serves, where the reasons alone leave it to
    them to piece together (float64 on a GPU: each kernel gives its own half of the answer)."""
    if req.dtype == "float64" and req.device_type == "cuda":
        return (
            "float64 on a CUDA device: no GPU kernel here computes float64 with this request's arguments "
            "(the cuda backend does for plain requests, softcap and offsets). Cast q, k, v to float32 "
            "(SPEC §6's float32 tolerance), or move them to the CPU, where the reference computes every "
            "SPEC argument in float64."
        )
    return ""


class Dispatcher:
    """Chooses the backend for a request, through :data:`CACHE`; safe to share across threads.
    ``measure`` (None: never) is asked about an auto choice the profile cannot make."""

    def __init__(self, cache: DispatchCache = CACHE, measure: Measure | None = None) -> None:
        self.cache = cache
        self.measure = measure

    def clear(self) -> None:
        """Drop every cached decision (the whole dispatch cache, plans included)."""
        self.cache.clear()

    def choose(self, req: Request, backend: str = "auto") -> Backend:
        key = ("choose", req, backend, *override_state())
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        _, name = _mode(backend)
        table = REGISTRY.backends()
        if name is not None and name in table:
            # A named backend: only its own verdict decides (explain_request would examine, and
            # import, every backend: a third of a second on a first call on the GPU host).
            reasons = backend_reasons(table[name], req, _disabled())
            if reasons:
                raise BackendUnsupported(name, reasons)
            self.cache.put(key, table[name])
            return table[name]
        exp = explain_request(req, backend)
        if self.measure is not None and exp.mode == "auto" and (exp.measured is None or exp.incomplete):
            exp = self.measure(req, exp)
        if exp.chosen is None:
            if name is not None:
                reasons = next(v.reasons for v in exp.verdicts if v.name == name)
                raise BackendUnsupported(name, reasons)
            raise NoBackendError({v.name: v.reasons for v in exp.verdicts}, _next_step(req))
        chosen = REGISTRY.backends()[exp.chosen]
        self.cache.put(key, chosen)
        return chosen


DISPATCHER = Dispatcher()
