"""The suite's CUDA path: inputs on the GPU, and the poisoned caching allocator catching unwritten output."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from attnhub import Backend, Causal, hookimpl
from attnhub.registry import REGISTRY
from attnhub_backends.reference import kernel
from attnhub_conformance.cases import Case
from attnhub_conformance.runner import CaseFailure, Certifier

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU (run on the device machine)", allow_module_level=True)


class _TorchCuda(Backend):
    """Computes with the reference on the host, writes into a fresh torch.empty output on the GPU."""

    name: ClassVar[str] = "t_conf_cuda"
    priority: ClassVar[int] = -50
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    skip_last_row: ClassVar[bool] = False

    def forward(self, q, k, v, req, mask=None, operands=None):
        host = [x.detach().cpu().double().numpy() for x in (q, k, v)]
        out64, lse64 = kernel.forward(*host, req, None)
        out = torch.empty((req.batch, req.heads_q, req.nq, req.dim_v), device=q.device, dtype=q.dtype)
        lse = torch.empty((req.batch, req.heads_q, req.nq), device=q.device, dtype=torch.float32)
        rows = req.nq - 1 if self.skip_last_row else req.nq
        out[:, :, :rows] = torch.from_numpy(out64[:, :, :rows]).to(out)
        lse.copy_(torch.from_numpy(np.asarray(lse64)).to(lse))
        return out, lse


class _Unwritten(_TorchCuda):
    name: ClassVar[str] = "t_conf_cuda_unwritten"
    skip_last_row: ClassVar[bool] = True


class _Plugin:
    @hookimpl
    def attnhub_backends(self):
        return [_TorchCuda(), _Unwritten()]


@pytest.fixture(scope="module", autouse=True)
def cuda_backends():
    plugin = _Plugin()
    REGISTRY.register_plugin(plugin)
    yield
    REGISTRY.unregister_plugin(plugin)


CASE = Case("float32", (37,), (29,), Causal(), sync="none_end", heads_q=4, heads_kv=2, lse=True)


def test_cuda_inputs_and_outputs_pass():
    cert = Certifier("t_conf_cuda", seed=5)
    assert cert.device == "cuda"
    assert cert.run(CASE).status == "pass"


def test_poisoned_allocator_reveals_unwritten_rows():
    cert = Certifier("t_conf_cuda_unwritten", seed=5)
    with pytest.raises(CaseFailure, match="NaN"):
        cert.run(CASE)
