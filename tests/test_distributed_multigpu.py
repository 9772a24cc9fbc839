"""Context parallelism on two or more GPUs over NCCL (one process a GPU, started by torchrun):
`benchmarks/cp_multi_gpu.py`'s correctness cases (causal, local windows, full, all-gather and
ring, zigzag and contiguous shards, `none_end` with Lq != Lk, large logits, packed documents, the
head-parallel variant) against float64 and
one GPU, forward and backward, bfloat16, and determinism. Skipped with fewer than two GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def test_context_parallel_on_every_gpu(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        pytest.skip(f"needs two or more GPUs (this machine has {n})")
    out = tmp_path / "cp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
           str(ROOT / "benchmarks" / "cp_multi_gpu.py"), "--skip-scaling", "--check-seq", "4096",
           "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **MULTICAST_OFF}, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["correctness"]
    assert len(rows) == 14
    bad = [r for r in rows if not (r["pass"] and r["deterministic"])]
    assert not bad, bad
