"""The two ways the JAX backend runs a request, as jitted, differentiable functions.

- ``blockwise``: :mod:`blockwise` under ``jax.custom_vjp`` (forward saves out and lse, the
  backward recomputes probabilities tile by tile), every SPEC feature.
- ``pallas``: the Pallas (Triton) forward kernel of :mod:`pallas` on NVIDIA GPUs for the
  requests cuDNN cannot serve (softcap, sinks and offsets included), with the same blockwise
  backward.
- ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` for the requests it serves
  exactly (see :mod:`cudnn`; right-padded lengths with the rule Full included); it differentiates
  through cuDNN's own backward.

Functions are built once per (request, path, config) and cached; each is a ``jax.jit`` so that
eager calls are compiled once and calls under an outer ``jit``/``grad``/``vmap`` inline it. Each
takes ``(q, k, v, mask, ops)``: ``mask`` a bool explicit mask or None, ``ops`` a dict of the §9-§11
arrays (see :func:`blockwise.forward`); bias and sinks get their gradients, integer arrays none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnhub import settings
from attnhub.request import Request
from attnhub_backends.jax import blockwise, cudnn, pallas
from attnhub_backends.jax.blockwise import Config

_CACHE: dict[tuple, Callable[..., tuple[Any, Any]]] = {}
_LOCK = threading.Lock()


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def config_for(req: Request) -> Config:
    """Tile sizes and compute dtype of the blockwise path for ``req`` on its device."""
    gpu = req.device_type == "cuda"
    pinned = settings.value("ATTNHUB_JAX_TILES")  # "bq,bk" (tests use small tiles)
    if pinned:
        bq, bk = pinned
    elif gpu:
        bq, bk = min(128, _round_up(req.nq, 16)), min(128, _round_up(req.nk, 16))
    else:
        bq, bk = min(128, req.nq), min(256, req.nk)
    half = req.dtype in ("float16", "bfloat16")
    compute = req.dtype if gpu or not half else "float32"
    return Config(bq=bq, bk=bk, compute_dtype=compute, lane_budget=(1 << 29) if gpu else (1 << 26))


def _zero_cotangent(mask: Any) -> Any:
    if mask is None:
        return None
    if jnp.issubdtype(mask.dtype, jnp.floating):
        return jnp.zeros(mask.shape, mask.dtype)
    return np.zeros(mask.shape, dtype=jax.dtypes.float0)


def _ops_cotangent(ops: dict[str, Any], dbias: Any, dsinks: Any) -> dict[str, Any]:
    """The cotangent of ``ops``: dbias and dsinks, float0 zeros for the integer arrays."""
    grads = {"bias": dbias, "sinks": dsinks}
    return {n: grads[n] if n in grads and x is not None else _zero_cotangent(x) for n, x in ops.items()}


def _build_blockwise(req: Request, cfg: Config, path: str) -> Callable[..., tuple[Any, Any]]:
    """``path`` "blockwise" or "pallas" forward under ``custom_vjp``; the blockwise backward."""

    def run_forward(q: Any, k: Any, v: Any, mask: Any, ops: dict[str, Any]) -> tuple[Any, Any]:
        if path == "pallas":
            return pallas.forward(q, k, v, req, sinks=ops.get("sinks"))
        return blockwise.forward(q, k, v, req, cfg, mask, ops=ops)

    @jax.custom_vjp
    def attend(q: Any, k: Any, v: Any, mask: Any, ops: dict[str, Any]) -> tuple[Any, Any]:
        return run_forward(q, k, v, mask, ops)

    def fwd(q: Any, k: Any, v: Any, mask: Any, ops: dict[str, Any]) -> tuple[tuple[Any, Any], tuple]:
        # The backward's rowsum(dO·O) cancels against dP on peaked rows: it gets O before rounding
        # to a half dtype (a bf16-rounded O cost dq twice SPEC's tolerance in a certify case;
        # tests/test_peaked_row_gradients.py has one for each path).
        wide = jnp.promote_types(q.dtype, jnp.float32)
        if path == "pallas":
            out_wide, lse = pallas.forward(q, k, v, req, out_dtype=wide, sinks=ops.get("sinks"))
        else:
            out_wide, lse = blockwise.forward(q, k, v, req, cfg, mask, out_dtype=wide, ops=ops)
        return (out_wide.astype(q.dtype), lse), (q, k, v, mask, ops, out_wide, lse)

    def bwd(res: tuple, cts: tuple[Any, Any]) -> tuple:
        q, k, v, mask, ops, out, lse = res
        dout, dlse = cts
        dq, dk, dv, dbias, dsinks = blockwise.backward(q, k, v, out, lse, dout, req, cfg, mask, dlse, ops)
        # A bool mask has no gradient; an additive one arrives as ops["bias"] (SPEC §9).
        return dq, dk, dv, _zero_cotangent(mask), _ops_cotangent(ops, dbias, dsinks)

    attend.defvjp(fwd, bwd)
    return jax.jit(attend)


def _build_cudnn(req: Request) -> Callable[..., tuple[Any, Any]]:
    def attend(q: Any, k: Any, v: Any, mask: Any, ops: dict[str, Any]) -> tuple[Any, Any]:
        return cudnn.attention(q, k, v, req, ops), None

    return jax.jit(attend)


def function_for(req: Request, path: str) -> Callable[..., tuple[Any, Any]]:
    """The cached jitted ``(q, k, v, mask, ops) -> (out, lse)`` of ``path`` for ``req``."""
    cfg = None if path == "cudnn" else config_for(req)
    key = (req, path, cfg, pallas.mode())
    fn = _CACHE.get(key)
    if fn is None:
        fn = _build_cudnn(req) if cfg is None else _build_blockwise(req, cfg, path)
        with _LOCK:
            if len(_CACHE) > 512:
                _CACHE.clear()
            _CACHE[key] = fn
    return fn
