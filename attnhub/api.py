"""The public entry points: ``attention``, ``explain`` and ``backends``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnhub.dispatch import DISPATCHER, Explanation, _disabled, explain_request
from attnhub.frameworks import Adapter, adapter_for
from attnhub.registry import REGISTRY
from attnhub.request import Request, build_request, from_canonical, to_canonical

# Validated requests by raw call signature, so that a repeated call skips validation.
_REQUESTS: dict[tuple, tuple[Request, Adapter]] = {}


def _raw_key(ad: Adapter, x: Any) -> tuple:
    return (type(x), tuple(x.shape), x.dtype, ad.device(x))


def _prepare(q, k, v, mask, sync, scale, layout, return_lse) -> tuple[Request, Adapter]:
    try:
        ad = adapter_for(q)
        if isinstance(mask, (str, type(None))) or not hasattr(mask, "shape"):
            mkey: Any = mask
        else:
            mkey = ("array",) + _raw_key(adapter_for(mask), mask)
        key = (
            _raw_key(ad, q), _raw_key(ad, k), _raw_key(ad, v), mkey, sync, scale, layout, return_lse,
            ad.requires_grad(q) or ad.requires_grad(k) or ad.requires_grad(v),
        )  # fmt: skip
        hit = _REQUESTS.get(key)
    except TypeError:  # something unhashable: validate without the cache
        key, hit = None, None
    if hit is not None:
        return hit
    found = build_request(q, k, v, mask, sync, scale, layout, return_lse)
    if key is not None and len(_REQUESTS) < 4096:
        _REQUESTS[key] = found
    return found


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    sync: str = "none_front",
    scale: float | None = None,
    layout: str = "bhsd",
    backend: str = "auto",
    return_lse: bool = False,
) -> Any:
    """Exact scaled-dot-product attention (SPEC.md) on the caller's arrays.

    Returns ``out`` in the caller's framework, device, dtype and layout, or ``(out, lse)`` with
    ``return_lse=True``. ``backend="auto"`` picks the highest-priority backend able to run the
    request; a named backend that cannot raises :class:`attnhub.BackendUnsupported`.
    """
    req, ad = _prepare(q, k, v, mask, sync, scale, layout, return_lse)
    chosen = DISPATCHER.choose(req, backend)
    if req.is_empty:
        return _empty_result(ad, q, req)
    qc = to_canonical(ad, q, layout)
    kc = to_canonical(ad, k, layout)
    vc = to_canonical(ad, v, layout)
    mc = None
    if hasattr(mask, "shape") and not isinstance(mask, str):
        mc = adapter_for(mask).reshape(mask, req.rule.shape)  # type: ignore[union-attr]
    out, lse = chosen.run(qc, kc, vc, req, mc)
    out = from_canonical(ad, out, req)
    if return_lse:
        return out, ad.reshape(lse, (req.batch, req.heads_q, *req.seq_q))
    return out


def _empty_result(ad: Adapter, like: Any, req: Request) -> Any:
    """SPEC §7: empty work returns an empty output; no keys means fully masked rows (0, -inf)."""
    out = ad.full((req.batch, req.heads_q, req.nq, req.dim_v), 0.0, req.dtype, like)
    out = from_canonical(ad, out, req)
    if not req.return_lse:
        return out
    lse_dtype = "float64" if req.dtype == "float64" else "float32"
    lse = ad.full((req.batch, req.heads_q, *req.seq_q), float("-inf"), lse_dtype, like)
    return out, lse


def explain(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    sync: str = "none_front",
    scale: float | None = None,
    layout: str = "bhsd",
    backend: str = "auto",
    return_lse: bool = False,
) -> Explanation:
    """Which backend ``attention`` would run for these arguments, and why each other one would not."""
    req, _ = build_request(q, k, v, mask, sync, scale, layout, return_lse)
    return explain_request(req, backend)


@dataclass(frozen=True)
class BackendRecord:
    """One registered backend as ``attnhub.backends()`` reports it."""

    name: str
    available: bool
    reason: str | None
    priority: int
    frameworks: tuple[str, ...]
    device_types: tuple[str, ...]
    dtypes: tuple[str, ...]
    features: tuple[str, ...]
    version: str | None
    disabled: bool


def backends() -> list[BackendRecord]:
    """Every registered backend, highest priority first, with availability and capabilities."""
    disabled = _disabled()
    records = []
    for b in REGISTRY.backends().values():
        try:
            reason = b.availability()
        except Exception as exc:  # an availability probe must never take the listing down
            reason = f"availability check raised {type(exc).__name__}: {exc}"
        try:
            version = b.version() if reason is None else None
        except Exception:
            version = None
        records.append(
            BackendRecord(
                name=b.name,
                available=reason is None,
                reason=reason,
                priority=b.priority,
                frameworks=tuple(b.frameworks),
                device_types=tuple(b.device_types),
                dtypes=tuple(b.dtypes),
                features=tuple(sorted(b.features)),
                version=version,
                disabled=b.name in disabled,
            )
        )
    return records
