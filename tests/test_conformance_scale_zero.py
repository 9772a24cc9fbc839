"""Scale 0 is a scale (every attended key weighs the same), not "use the default": a backend that
reads ``scale or 1/sqrt(D)`` (or, like cuDNN's SDPA graph, returns NaN for ``attn_scale=0``) must
fail certify's "custom scale" row; the reference passes it."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import pytest

from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance import report as rep
from attnhub_conformance.cases import full_grid, quick_grid
from attnhub_conformance.runner import Certifier
from tests.plugged import plugged_in, run_all


class _ZeroScaleAsDefault(ReferenceBackend):
    """Treats ``scale == 0`` as the default scale, as ``scale or 1 / sqrt(D)`` does."""

    name: ClassVar[str] = "t_scale_zero_default"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        if req.scale == 0:
            req = dataclasses.replace(req, scale=1 / math.sqrt(req.dim_qk))
        return super().forward(q, k, v, req, mask, operands)


@pytest.fixture(scope="module")
def broken():
    with plugged_in(_ZeroScaleAsDefault()):
        yield


def _zero_scale(cases):
    return [c for c in cases if c.scale == 0.0]


def test_both_grids_hold_a_zero_scale_case():
    assert _zero_scale(quick_grid(("float32",), "numpy"))
    assert _zero_scale(full_grid(("float32",), "numpy"))


@pytest.mark.parametrize("name, status", [("reference", "pass"), ("t_scale_zero_default", "FAIL")])
def test_zero_scale_case_passes_the_reference_and_fails_the_default_reader(broken, name, status):
    cases = _zero_scale(quick_grid(("float32",), "numpy"))
    m = rep.aggregate(run_all(Certifier(name, seed=5), cases))
    assert m["custom scale"]["float32"]["status"] == status, m["custom scale"]
