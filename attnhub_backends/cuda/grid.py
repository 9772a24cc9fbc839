"""Launch grids of the cuda kernels: which axis carries the query / key tiles, in which order the
blocks run, and the limits of a CUDA grid that bound the requests the backend takes."""

from __future__ import annotations

from attnhub import settings
from attnhub.request import Request
from attnhub.rules import Causal, Local
from attnhub_backends.cuda.tiles import ceil_div

#: Largest y / z extent of a CUDA grid.
MAX_GRID_YZ = 65535

#: Default grid order of the mma.sync backward's key-tile kernels (dK/dV, fused): ``rule`` (the
#: forward's); ATTNHUB_CUDA_BWD_ORDER overrides it. ``tiles`` measured mixed: faster for causal
#: L = 2k / 4k, slower at L = 16k, where its 64-key blocks leave a tail of heavy blocks.
MMA_BWD_ORDER = "rule"
#: Default grid order of the Hopper backward: ``tiles``, so that the blocks running together share
#: one head's Q / dO in L2 (with ``heads`` each streams a different head's from memory, and ran slower).
WGMMA_BWD_ORDER = "tiles"


def grid_ok(req: Request, tiles_on_z: bool = False) -> list[str]:
    """Limits of the launch grid and of 32-bit index arithmetic. ``tiles_on_z``: the kernels may put
    64-row (or larger) tiles on the grid's z axis (the tensor-core kernels under causal rules)."""
    reasons = []
    if max(req.nq, req.nk) >= 1 << 30:
        reasons.append(f"sequences up to 2**30 positions, got Nq={req.nq} Nk={req.nk}")
    if tiles_on_z and max(req.nq, req.nk) > MAX_GRID_YZ * 64:
        reasons.append(f"sequences longer than {MAX_GRID_YZ * 64} (a CUDA grid's z extent of 64-row tiles)")
    if req.heads_q > MAX_GRID_YZ or req.batch > MAX_GRID_YZ:
        reasons.append(f"batch and heads up to {MAX_GRID_YZ}, got B={req.batch} Hq={req.heads_q}")
    return reasons


def tile_major(req: Request) -> bool:
    """Causal rules: work grows with the query tile, so tiles go on the grid's z axis (heaviest first
    for every head); otherwise heads do, and the blocks running together share K and V in L2."""
    rule = req.rule
    return isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)


def ordered_tile_major(req: Request, setting: str, default: str) -> bool:
    """Grid order of a kernel from ``setting`` (else ``default``): ``tiles`` puts the tiles of one head
    next to each other (they share its K / V, or Q / dO, in L2; the heaviest causal tile of each head
    still starts first), ``heads`` the heaviest tile of every head first, ``rule`` follows
    :func:`tile_major` (heads under causal rules)."""
    order = settings.value(setting) or default
    return tile_major(req) if order == "rule" else order == "heads"


def grid_order(tiles: int, heads: int, batch: int, major: bool) -> tuple[int, int, int]:
    """(heads, batch, tiles) when ``major`` (tile-major), else (tiles, heads, batch): the layouts the
    kernels' GridPos decodes."""
    return (heads, batch, tiles) if major else (tiles, heads, batch)


def rule_grid(req: Request, tiles: int, heads: int) -> tuple[int, int, int]:
    """The (x, y, z) grid of the tensor-core kernels, as :func:`tile_major` orders it."""
    return grid_order(tiles, heads, req.batch, tile_major(req))


def row_tiles(req: Request, cfg: tuple[int, ...]) -> int:
    """Query tiles of an mma.sync-style forward tile ``(warps, bn, row blocks)``: each warp's row
    block holds 16 query rows."""
    return ceil_div(req.nq, 16 * cfg[0] * cfg[2])


def key_tile_grid(req: Request, block_keys: int, default: str) -> tuple[tuple[int, int, int], bool]:
    """(grid, tile_major) of a backward kernel with one block per key tile of a kv head; its order
    from ``ATTNHUB_CUDA_BWD_ORDER``, else ``default``."""
    tiles, major = ceil_div(req.nk, block_keys), ordered_tile_major(req, "ATTNHUB_CUDA_BWD_ORDER", default)
    return grid_order(tiles, req.heads_kv, req.batch, major), major


def wgmma_forward_grid(req: Request, nwg: int) -> tuple[tuple[int, int, int], bool]:
    """(grid, tile_major) of the wgmma forward (64 query rows per warpgroup); its order from
    ``ATTNHUB_CUDA_FWD_ORDER``, else as :func:`tile_major`."""
    tiles, major = ceil_div(req.nq, 64 * nwg), ordered_tile_major(req, "ATTNHUB_CUDA_FWD_ORDER", "rule")
    return grid_order(tiles, req.heads_q, req.batch, major), major
