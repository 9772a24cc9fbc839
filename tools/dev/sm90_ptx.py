"""Compile triton launches for sm90 on a machine without a GPU, and count the PTX instructions by
opcode: a check that a kernel edit compiles and does the same work, when no device time is left
(Triton's own version here, not necessarily the device image's; the interpreter accepts code that
the compiler rejects).

    python tools/dev/sm90_ptx.py [softcap|alibi|ragged] [DTYPE] [bias|alibi|both]

With ``PTX_DUMP=DIR`` each launch's PTX is also written to DIR/KERNEL-N.ptx.

softcap: the dense forward with softcap; alibi: the dense forward and backward with ALiBi and a
bias; ragged: the ragged forward and backward with a bias (dbias) and ALiBi over padded lengths.

The launch code runs as on one H100 (sm90, 132 SMs); each kernel launch is bound with Triton's
own binder and compiled with ``triton.compile`` instead of run.
"""

from __future__ import annotations

import collections
import math
import os
import re
from collections import OrderedDict

os.environ["TRITON_INTERPRET"] = "0"
os.environ["ATTNHUB_TRITON_TUNE"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from attnhub.request import Request  # noqa: E402
from attnhub.rules import Causal  # noqa: E402
from attnhub_backends.triton import args as kargs  # noqa: E402
from attnhub_backends.triton import configs, device, launch, loader  # noqa: E402
from attnhub_backends.triton.modifiers import Mods  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
OPS = re.compile(r"^\s+(ex2|rcp|fma|mul|add|sub|max|selp|wgmma|mma|cvt)\b")


def _recording_module(backend, dense, out: list) -> object:
    class Module:
        def __getattr__(self, name):
            fn = getattr(dense, name)
            binder = create_function_from_signature(fn.signature, fn.params, backend)

            class Indexed:
                def __getitem__(self, grid):
                    def call(*args, **kwargs):
                        bound, spec, options = binder(*args, **kwargs)
                        opts, sig, consts, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
                        k = triton.compile(
                            ASTSource(fn, sig, consts, attrs), target=TARGET, options=opts.__dict__
                        )
                        ops = collections.Counter(
                            m.group(1) for line in k.asm["ptx"].splitlines() if (m := OPS.match(line))
                        )
                        if os.environ.get("PTX_DUMP"):  # the PTX itself, one file per launch
                            path = f"{os.environ['PTX_DUMP']}/{name}-{len(out)}.ptx"
                            with open(path, "w") as f:
                                f.write(k.asm["ptx"])
                        keys = ("BM", "BN", "BAND", "CAP_MAX", "SOFTCAP")
                        flat = kargs.flat(kwargs)  # constexprs come as named tuples (args.py)
                        out.append((name, {x: flat[x] for x in keys if x in flat}, dict(sorted(ops.items()))))

                    return call

            return Indexed()

    return Module()


def main() -> None:
    import sys

    part = sys.argv[1] if len(sys.argv) > 1 else "softcap"
    out: list = []
    device.on_gpu = lambda d: True
    device.capability = lambda d: (9, 0)
    device.sm_count = lambda d: 132
    launch._FWD_LAUNCHES = OrderedDict()
    configs._CHOSEN = {}
    module = _recording_module(make_backend(TARGET), loader.kernels(interpret=False), out)
    launch.kernels = lambda: module
    if part != "softcap":
        return modified(part, out, module)
    for dtype, cap in ((torch.bfloat16, 30.0), (torch.bfloat16, 50.0), (torch.float16, 30.0)):
        b, h, n, d = 8, 16, 4096, 128
        req = Request(
            "torch", "cuda:0", str(dtype).removeprefix("torch."), "bhsd", b, h, h, (n,), (n,), d, d, Causal(),
            "none_front", 1 / math.sqrt(d), softcap=cap,
        )  # fmt: skip
        q = torch.empty((b, h, n, d), dtype=dtype, device="meta")
        launch.forward(q, q, q, req, mods=Mods(softcap=cap))
        for name, consts, ops in out:
            print(f"{dtype} softcap {cap}: {name} {consts} {ops}")
        out.clear()


def modified(part: str, out: list, dense_module: object) -> None:
    """ALiBi (and a bias) through the dense or the ragged launches, forward and backward."""
    import dataclasses
    import sys

    from attnhub.operands import Operands
    from attnhub_backends.triton import ragged_launch

    b, h, n, d = 2, 8, 1024, 64
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    which = sys.argv[3] if len(sys.argv) > 3 else "both"
    q = torch.empty((b, h, n, d), dtype=dtype, device="meta")
    lse = torch.empty((b, h, n), dtype=torch.float32, device="meta")
    slopes = torch.empty((1, h), dtype=torch.float32, device="meta")
    bias = torch.empty((1, h, n, n), dtype=dtype, device="meta")
    if which == "alibi":
        bias = None
    if which == "bias":
        slopes = None
    req = Request(
        "torch", "cuda:0", str(dtype).removeprefix("torch."), "bhsd", b, h, h, (n,), (n,), d, d, Causal(),
        "none_front", 1 / math.sqrt(d), needs_grad=True, bias=None if bias is None else (1, h, n, n),
        bias_grad=bias is not None, more=() if slopes is None else (("alibi_slopes", (1, h)),),
    )  # fmt: skip
    if part == "alibi":
        mods = Mods(bias=bias, alibi=slopes)
        launch.forward(q, q, q, req, mods=mods)
        launch.backward(q, q, q, q, lse, q, req, mods=mods)
    else:
        ragged_launch._on_gpu = lambda dv: True
        ragged_launch._sm_count = lambda dv: 132
        ragged_mod = _recording_module(make_backend(TARGET), ragged_launch._kernels(), out)
        ragged_launch._kernels = lambda: ragged_mod
        ragged_launch.dense_kernels = lambda: dense_module
        lens = torch.empty((b,), dtype=torch.int32, device="meta")
        req = dataclasses.replace(req, q_lengths=True, k_lengths=True, padding_side="left")
        ops = Operands(
            bias=bias,
            q_lengths=lens,
            k_lengths=lens,
            more=None if slopes is None else {"alibi_slopes": slopes},
        )
        ragged_launch.forward(q, q, q, req, ops)
        ragged_launch.backward(q, q, q, q, lse, q, req, ops)
    for name, consts, ops_ in out:
        print(f"{part}: {name} {consts} {ops_}")


if __name__ == "__main__":
    main()
