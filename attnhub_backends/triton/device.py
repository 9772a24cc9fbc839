"""What the device gives the triton kernels: a GPU or the interpreter, its compute capability and
SM count, how ``tl.dot`` multiplies (``dot_precision``), and how the forwards read K and V
(pointers, or host-made TMA descriptors: ``tma_mode``, ``kv_descriptors``). Tests and tools
stand in for a GPU by replacing ``on_gpu``, ``capability`` and ``sm_count`` here."""

from __future__ import annotations

import math
from typing import Any

import torch

from attnhub import settings
from attnhub.errors import AttnhubError
from attnhub_backends.triton.loader import interpret_mode


def dot_precision(x: torch.Tensor) -> str:
    """kernels._dot's mode: exact float32 for float32 inputs, tensor cores in the input dtype for
    16-bit ones, except bfloat16 under the interpreter (upcast: its bfloat16 product is wrong)."""
    if x.dtype == torch.float32:
        return "ieee"
    if x.dtype == torch.bfloat16 and interpret_mode():
        return "ieee_upcast"
    return "native"


def pad(d: int) -> int:
    return max(16, 1 << math.ceil(math.log2(d)))


def on_gpu(device: torch.device) -> bool:
    """A CUDA device (compiled kernels): configs, split-KV and TMA are chosen for it."""
    return device.type == "cuda"


def capability(device: torch.device) -> tuple[int, int]:
    if on_gpu(device):
        return torch.cuda.get_device_capability(device)
    return (0, 0)


# The forward's K/V load paths (ATTNHUB_TRITON_TMA's values); see kernels._load_kv.
POINTERS = 0


DESCRIPTORS = 3  # host-made 4-d (B, H, L, D) tensor descriptors: TMA loads


def tma_mode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: bool = False,
    dims: tuple[int, ...] = (128,),
    bias: bool = False,
) -> int:
    """The forward's K/V load path: ``DESCRIPTORS`` where TMA's rules hold, else ``POINTERS``.

    Descriptors need 16-byte aligned bases and outer strides, a contiguous head dim and a head dim
    that is its own power-of-two tile (no padding). By default they are used on sm90+ for 16-bit
    dtypes at the head dims ``dims`` where they were measured faster (the dense forward: 128; the
    ragged forward, its decode programs included: 64 and 128), except for the dense forward's
    decode-shaped calls (``packed``: GQA rows packed into one tile, split-KV), where pointer loads
    were faster (docs/backends/triton.md), and forwards that read a ``bias`` tile per key tile: on
    the pointer path a key count that is a multiple of the key tile (EVEN_K, off under TMA) lets
    every bias load go unmasked and pipelined (H100, B 4, H 16, L 4k, D 128, (1, H, L, L) bias:
    1.46 against 2.16 ms, tools/dev/probe_s5.py at 0dabcb3, part biascfg). The interpreter always uses
    pointers. ``ATTNHUB_TRITON_TMA=0`` or ``=3`` forces a path where it is allowed (packed and bias
    calls too).
    """
    env = settings.raw("ATTNHUB_TRITON_TMA")
    if not env:  # unset (or set empty): the default
        if packed or bias or interpret_mode() or not on_gpu(q.device) or capability(q.device)[0] < 9:
            return 0
        if q.dtype not in (torch.float16, torch.bfloat16):
            return 0
        if q.shape[-1] not in dims or v.shape[-1] != q.shape[-1]:
            return 0  # where no gain was measured (the dense forward at 64: docs/benchmarks.md)
        mode = DESCRIPTORS
    else:
        try:
            mode = int(env)
        except ValueError:
            mode = -1
        if mode not in (POINTERS, DESCRIPTORS):
            raise AttnhubError(
                f"ATTNHUB_TRITON_TMA takes 0 (pointers) or 3 (descriptors), the K/V load path, got {env!r}"
            )
    if mode == POINTERS or interpret_mode():
        return POINTERS
    size = k.element_size()
    for x in (k, v):
        d = x.shape[-1]
        if x.stride(-1) != 1 or d != pad(d) or d * size < 16 or x.data_ptr() % 16:
            return 0
        if any((s * size) % 16 for s in x.stride()[:-1]):
            return 0
    return mode


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, bn: int) -> tuple[Any, Any]:
    """Host-made 4-d tensor descriptors of K and V (their own shapes and strides) whose blocks are
    ``bn`` keys of one (batch entry, head): what the forwards' TMA loads read. Callers have checked
    TMA's alignment rules for these tensors (``tma_mode``, part of their plan's signature)."""
    return _descriptor(k, bn), _descriptor(v, bn)


#: Checked descriptors without a tensor, by (shape, strides, dtype, block rows): a call copies one
#: and sets its base (0.4 µs) instead of building and checking a new one (2.7 µs on this
#: repository's CPU; a decode step builds two per launch).
_DESCRIPTORS: dict[tuple, Any] = {}


def _descriptor(x: torch.Tensor, bn: int) -> Any:
    key = (x.shape, x.stride(), x.dtype, bn)
    template = _DESCRIPTORS.get(key)
    if template is None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        made = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, bn, x.shape[-1]])
        if not hasattr(made, "__dict__"):  # a Triton whose descriptors have slots: no templates
            return made
        made.base = None  # the cache must not keep a caller's tensor alive
        if len(_DESCRIPTORS) >= 64:
            _DESCRIPTORS.clear()
        template = _DESCRIPTORS[key] = made
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base = x
    return desc


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
