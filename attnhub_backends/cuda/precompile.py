"""Compile every cuda kernel variant ahead, into the disk cache (``python -m
attnhub_backends.cuda.precompile sm_90 [sm_80 ...]``): the catalogue (variants.py) over the
compiler (compiler.py), so that neither imports the other's user."""

from __future__ import annotations

import os

from attnhub_backends.cuda.compiler import Variant, cache_dir, get_cubin
from attnhub_backends.cuda.variants import (
    WGMMA_ARCH,
    all_variants,
    mod_variants,
    wgmma_mod_variants,
    wgmma_variants,
)


def _compile_job(job: tuple[Variant, str]) -> tuple[str, str, int]:
    variant, arch = job
    return variant.name, arch, len(get_cubin(variant, arch))


def precompile(archs: tuple[str, ...], workers: int | None = None) -> list[tuple[str, str, int]]:
    """Compile every variant for ``archs`` (score-modifier ones included) into the disk cache, in
    parallel processes."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(v, a) for v in all_variants() + mod_variants() for a in archs]
    if "sm_90" in archs:
        jobs += [(v, WGMMA_ARCH) for v in wgmma_variants() + wgmma_mod_variants()]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        return [_compile_job(j) for j in jobs]
    with ProcessPoolExecutor(workers) as ex:
        return list(ex.map(_compile_job, jobs))


if __name__ == "__main__":  # python -m attnhub_backends.cuda.precompile sm_90 [sm_80 ...]
    import sys
    import time

    t0 = time.perf_counter()
    for row in precompile(tuple(sys.argv[1:]) or ("sm_90",)):
        print(*row)
    print(f"compiled into {cache_dir()} in {time.perf_counter() - t0:.1f} s")
