"""Score modifiers (SPEC §9) as the kernels take them: the MODS bits their variant is built with and
the launch arguments of common.cuh's ``MOD_PARAMS`` (bias pointer and strides, softcap, dS buffer).

dbias: the backward records dS of every (batch, head, query, key) pair in a zeroed float32 (float64)
buffer, reduced here with torch over the bias's broadcast dimensions. That buffer is B·Hq·Nq·Nk
elements: the memory of one score matrix per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhub.operands import Operands
from attnhub.request import Request
from attnhub_backends.cuda.device import f64, i64, ptr
from attnhub_backends.cuda.variants import MOD_BIAS, MOD_DBIAS, MOD_SOFTCAP


@dataclass(frozen=True)
class ScoreMods:
    """One call's modifiers: ``bits`` (the variant's MODS), ``args`` (MOD_PARAMS), the bias in the
    kernels' accumulation dtype and the dS buffer (kept alive here while the kernels run)."""

    bits: int
    args: tuple[Any, ...]
    bias: Any = None
    ds: Any = None

    @staticmethod
    def of(req: Request, operands: Operands | None, acc: Any, grad: bool = False) -> ScoreMods | None:
        """The modifiers of ``req`` (None without softcap and bias); ``acc``: the torch dtype the
        kernels read the bias in (float32, float64 for float64 inputs); ``grad``: for the backward
        (with ``req.bias_grad``, a dS buffer for dbias)."""
        if req.softcap is None and req.bias is None:
            return None
        import torch

        bits, bias, ds, strides = 0, None, None, (0, 0, 0, 0)
        if req.softcap is not None:
            bits |= MOD_SOFTCAP
        if req.bias is not None:
            if operands is None or operands.bias is None:
                raise ValueError("the cuda backend needs operands.bias for a request with a bias")
            bits |= MOD_BIAS
            bias = operands.bias.to(dtype=acc)
            strides = tuple(0 if n == 1 else st for n, st in zip(bias.shape, bias.stride()))
            if grad and req.bias_grad:
                bits |= MOD_DBIAS
                shape = (req.batch, req.heads_q, req.nq, req.nk)
                ds = torch.zeros(shape, dtype=acc, device=bias.device)
        args = (
            ptr(bias) if bias is not None else np.uint64(0),
            *(i64(s) for s in strides),
            f64(req.softcap or 0.0),
            ptr(ds) if ds is not None else np.uint64(0),
        )
        return ScoreMods(bits, args, bias, ds)

    def dbias(self, bias: Any) -> Any:
        """dL/dbias: the recorded dS summed over ``bias``'s broadcast dimensions, in its dtype."""
        dims = [d for d, n in enumerate(bias.shape) if n == 1 and self.ds.shape[d] != 1]
        g = self.ds.sum(dim=dims, keepdim=True) if dims else self.ds
        return g.to(bias.dtype)
