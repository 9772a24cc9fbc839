"""The ``jax`` backend: attention for JAX arrays on CPU and NVIDIA GPUs, jit/grad/vmap-compatible."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from importlib import metadata
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.frameworks import FLOAT_DTYPES
from attnhub.request import Request

#: The §9-§11 arrays the compute functions take (a dict of these names; None where absent).
OPERAND_NAMES = ("bias", "sinks", "q_lengths", "k_lengths", "cu_seqlens_q", "cu_seqlens_k")


def prepare(req: Request, mask: Any, operands: Any) -> tuple[Request, Any, dict[str, Any]]:
    """(request, bool mask or None, ops dict) for the compute paths."""
    return req, mask, {n: getattr(operands, n, None) for n in OPERAND_NAMES}


def gather_pages(k: Any, v: Any, req: Request, block_table: Any) -> tuple[Any, Any, Request]:
    """Contiguous (B, Hkv, max_blocks·block_size, D) k and v of a paged cache (SPEC §10), gathered
    by ``block_table`` inside the trace (differentiable through the gather)."""
    import jax.numpy as jnp

    def one(x: Any) -> Any:
        g = jnp.take(x, block_table.astype(jnp.int32), axis=0, mode="clip")  # (B, nb, bs, H, D)
        b, nb, bs, h, d = g.shape
        return jnp.transpose(g.reshape(b, nb * bs, h, d), (0, 2, 1, 3))

    return one(k), one(v), replace(req, paged=0)


class JaxBackend(Backend):
    """Blockwise online-softmax attention in ``jax.lax``; cuDNN on NVIDIA GPUs where it is exact.

    ``run`` returns ``jax.Array``s from a ``jax.custom_vjp`` function, so ``jax.grad``,
    ``jax.jit`` and ``jax.vmap`` work on ``attnhub.attention`` directly. SPEC §9-§11: the
    blockwise path serves every argument (bias with dbias, softcap, sinks with dsinks, lengths,
    packed sequences, offsets; paged caches gathered by their block table inside the trace), the
    arrays possibly traced; Pallas serves softcap, sinks and offsets, cuDNN right-padded lengths
    with the rule Full; anything else of §9-§11 falls back to blockwise.
    """

    name: ClassVar[str] = "jax"
    priority: ClassVar[int] = 50
    frameworks: ClassVar[tuple[str, ...]] = ("jax",)
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward", "dlse"}
        | {"bias", "dbias", "softcap", "sinks", "lengths", "varlen", "paged", "offsets"}
    )
    requires: ClassVar[tuple[str, ...]] = ("jax",)

    def availability(self) -> str | None:
        if importlib.util.find_spec("jax") is None:
            return "jax is not installed: pip install 'attnhub[jax]'"
        return None

    def version(self) -> str | None:
        mod = sys.modules.get("jax")
        if mod is not None:
            return f"jax {mod.__version__}"
        try:
            return f"jax {metadata.version('jax')}"
        except metadata.PackageNotFoundError:
            return None

    def extra_reasons(self, req: Request) -> list[str]:
        if req.ndim > 1 and (req.ragged or req.q_offset or req.k_offset):
            return ["lengths, packed sequences, paged caches and offsets are 1-d only (SPEC §10-§11)"]
        if req.dtype == "float64" and req.framework == "jax":
            import jax

            if not jax.config.jax_enable_x64:
                return [
                    "float64 needs jax's 64-bit mode: jax.config.update('jax_enable_x64', True) "
                    "(or JAX_ENABLE_X64=1)"
                ]
        return []

    def path_for(self, req: Request) -> tuple[str, str]:
        """(path, why): ``"cudnn"`` where cuDNN serves ``req`` exactly, else ``"pallas"`` on NVIDIA
        GPUs where the Pallas kernel can, else ``"blockwise"``."""
        from attnhub_backends.jax import cudnn, pallas

        why = cudnn.obstacles(req)
        if not why:
            return "cudnn", "jax.nn.dot_product_attention(implementation='cudnn') serves it exactly"
        not_cudnn = "cuDNN: " + "; ".join(why)
        why_not = pallas.obstacles(req)
        if not why_not:
            return "pallas", f"Pallas flash kernel with tile skipping ({not_cudnn})"
        return "blockwise", f"blockwise online softmax in jax.lax ({not_cudnn}; Pallas: {'; '.join(why_not)})"

    def note(self, req: Request) -> str | None:
        path, why = self.path_for(req)
        return f"path={path}: {why}"

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        """(out, lse) of the blockwise path (always with lse), not differentiable by itself."""
        from attnhub_backends.jax import blockwise
        from attnhub_backends.jax.paths import config_for

        req, mask, ops = prepare(req, mask, operands)
        if req.paged:
            k, v, req = gather_pages(k, v, req, operands.block_table)
        return blockwise.forward(q, k, v, req, config_for(req), mask, ops=ops)

    def backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        dout: Any,
        req: Request,
        mask: Any = None,
        operands: Any = None,
        dlse: Any = None,
    ) -> tuple[Any, ...]:
        """(dq, dk, dv), plus (dbias, dsinks) for a request with a bias or sinks (SPEC §9)."""
        from attnhub_backends.jax import blockwise
        from attnhub_backends.jax.paths import config_for

        with_extras = req.bias is not None or req.sinks
        req, mask, ops = prepare(req, mask, operands)
        if req.paged:
            raise NotImplementedError("paged backward: run through attnhub.attention (jax.grad)")
        dq, dk, dv, dbias, dsinks = blockwise.backward(
            q, k, v, out, lse, dout, req, config_for(req), mask, dlse, ops
        )
        if not with_extras:
            return dq, dk, dv
        return dq, dk, dv, dbias if req.bias_grad else None, dsinks if req.sinks_grad else None

    def run(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        """The chosen path as a jitted ``custom_vjp`` function (cuDNN: its own VJP); bias and
        sinks are differentiable arguments, a paged cache is gathered first."""
        from attnhub_backends.jax.paths import function_for

        req, mask, ops = prepare(req, mask, operands)
        if req.paged:
            k, v, req = gather_pages(k, v, req, operands.block_table)
        path, _ = self.path_for(req)
        return function_for(req, path)(q, k, v, mask, ops)
