"""Triton helpers shared by the dense (``kernels.py``) and ragged (``ragged_kernels.py``) kernels.

Only helpers whose meaning is the same in both families live here. The two families' other
look-alikes differ on purpose: the dense softcap takes tanh through the hardware's approximate
reciprocal (``kernels._tanh``; the forward is bound by the special functions there) while the
ragged one divides (``ragged_kernels._softcap``), and the rules are evaluated from different
position maps (``kernels._keep``: 1-d and 2-d grids, the rule's thirteen scalars; the ragged
``_keep``: one sequence's entry).

Executed once per mode (compiled or ``TRITON_INTERPRET=1``) by ``loader.py``, like the kernels that
import it (``loader.load("tiles.py")`` from within their own execution).
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, acc=None):
    """a @ b (+ acc). DOT_PRECISION "native": tensor cores in the operands' dtype; "ieee": exact
    float32 (no tf32); "ieee_upcast": operands upcast to float32 first (Triton's interpreter
    multiplies bfloat16 operands wrongly)."""
    if DOT_PRECISION == "ieee":
        return tl.dot(a, b, acc, input_precision="ieee")
    elif DOT_PRECISION == "ieee_upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)
