"""How many Triton kernel specialisations the full conformance grid asks for, and per --jobs shard.

Runs every full-grid case of ``attnhub certify triton`` through Triton's interpreter (set
``TRITON_INTERPRET=1``; ~8 min on 2 cores) and records, per launch, what Triton compiles a
variant for: the kernel, its constexpr/launch keywords, and per argument the specialisation Triton
applies (integers: == 1 and % 16 == 0; tensors: dtype and 16-byte alignment). On a GPU each
distinct record is one compile, in every process that meets it, so the numbers below bound what
``certify triton -j N`` compiles per shard.

    TRITON_INTERPRET=1 python tools/dev/triton_specialisations.py [--jobs 4,8,16]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from attnhub_backends.triton import launch, loader
from attnhub_conformance.cases import full_grid
from attnhub_conformance.runner import CaseFailure, Certifier


def _arg_key(a: Any) -> Any:
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        return ("i", a == 1, a % 16 == 0)
    if isinstance(a, float):
        return "f"
    if isinstance(a, torch.Tensor):
        return ("t", str(a.dtype), a.data_ptr() % 16 == 0)
    if isinstance(a, tuple):  # strides and operands as tuples: Triton specialises each member
        return tuple(_arg_key(x) for x in a)
    return type(a).__name__


class _Recorder:
    """Stands in for the kernels module: records each launch's specialisation, then launches."""

    def __init__(self, module: Any) -> None:
        self.module, self.case, self.seen = module, "", {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.module, name)
        if not name.endswith("_kernel"):
            return fn
        rec = self

        class _Indexed:
            def __getitem__(self, grid: Any) -> Any:
                run = fn[grid]

                def call(*args: Any, **kw: Any) -> Any:
                    key = (name, tuple(sorted(kw.items())), tuple(_arg_key(a) for a in args))
                    rec.seen.setdefault(rec.case, set()).add(key)
                    return run(*args, **kw)

                return call

        return _Indexed()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="4,8,16")
    args = ap.parse_args()
    if not loader.interpret_mode():
        raise SystemExit("set TRITON_INTERPRET=1 (this counts launches; it compiles nothing)")
    rec = _Recorder(loader.kernels())
    launch.kernels = lambda: rec
    cert = Certifier("triton", seed=20261122)
    cases = full_grid(tuple(cert.backend.dtypes), "torch")
    for i, case in enumerate(cases):
        rec.case = case.id
        try:
            cert.run(case)
        except CaseFailure as exc:
            print("FAIL", case.id, exc)
        if i % 100 == 0:
            print(f"{i}/{len(cases)} cases", flush=True)
    every = {k for keys in rec.seen.values() for k in keys}
    no_ints = {
        (n, kw, tuple("i" if isinstance(a, tuple) and a[0] == "i" else a for a in ax)) for n, kw, ax in every
    }
    print(f"{len(cases)} grid cases, {len(every)} distinct specialisations "
          f"({len(no_ints)} if integer arguments were not specialised)")  # fmt: skip
    for n in (int(x) for x in args.jobs.split(",")):
        shards: list[set] = [set() for _ in range(n)]
        for i, case in enumerate(cases):  # certify --jobs: round-robin over the grid
            shards[i % n] |= rec.seen.get(case.id, set())
        sizes = [len(s) for s in shards]
        print(f"--jobs {n}: compiles summed over shards {sum(sizes)}, slowest shard {max(sizes)}")


if __name__ == "__main__":
    main()
