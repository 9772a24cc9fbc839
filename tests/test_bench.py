"""attnhub bench on the CPU: the grid, FLOP counts, the table, JSON and plot (timing needs a GPU)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from attnhub.bench.grid import Case, attended_pairs, default_grid, flops
from attnhub.bench.report import table_text, write_json, write_plot
from attnhub.bench.timing import Result
from attnhub.positions import dense_rule_mask
from attnhub.rules import Causal, Full, Local


def test_default_grid_matches_issue() -> None:
    grid = default_grid()
    dense = [c for c in grid if c.family == "dense"]
    assert {c.dim for c in dense} == {64, 128}
    assert {c.len_q for c in dense} == {1024, 2048, 4096, 8192, 16384}
    assert all(c.batch * c.len_q == 16384 and c.heads_q * c.dim == 2048 for c in dense)
    assert {c.direction for c in grid} == {"fwd", "bwd"}
    local = [c for c in grid if c.family == "local"]
    assert {c.rule.window for c in local} == {256, 1024} and all(c.len_q == 16384 for c in local)
    assert all(c.sync == "none_end" and c.rule.causal for c in local)
    decode = [c for c in grid if c.family == "decode"]
    assert {c.len_k for c in decode} == {8192, 32768}
    assert all(c.len_q == 1 and c.heads_q == 32 and c.heads_kv == 8 for c in decode)
    assert len(default_grid(quick=True)) < len(grid)


@pytest.mark.parametrize(
    "rule,lq,lk,sync",
    [
        (Causal(), 50, 50, "none_front"),
        (Causal(), 30, 70, "none_end"),
        (Local(7, causal=True), 64, 64, "none_end"),
        (Local(5), 40, 80, "scale_front"),
        (Local(3, log2_stride=2), 60, 60, "none_front"),
        (Full(), 10, 20, "none_front"),
    ],
)
def test_attended_pairs_exact(rule, lq, lk, sync) -> None:
    assert attended_pairs(rule, lq, lk, sync) == int(dense_rule_mask(rule, (lq,), (lk,), sync).sum())


def test_flops_convention() -> None:
    c = Case("dense", 2, 4, 4, 1024, 1024, 64, Full())
    assert flops(c) == 4 * 2 * 4 * 1024 * 1024 * 64
    assert flops(Case("dense", 2, 4, 4, 1024, 1024, 64, Causal())) == flops(c) / 2
    assert flops(Case("dense", 2, 4, 4, 1024, 1024, 64, Full(), direction="bwd")) == 2.5 * flops(c)
    loc = Case("local", 1, 1, 1, 4096, 4096, 64, Local(256, causal=True), "none_end")
    pairs = 256 * 4096 - 256 * 255 // 2
    assert flops(loc) == 4 * pairs * 64


def test_table_json_plot(tmp_path) -> None:
    results = []
    for n in (1024, 2048):
        case = Case("dense", 16384 // n, 16, 16, n, n, 128, Causal())
        results.append(Result("triton", case, ms=1.0, tflops=300.0))
        results.append(Result("sdpa-flash", case, ms=1.5, tflops=200.0))
        results.append(Result("flex", case, error="needs torch.compile"))
    text = table_text(results, ["triton"], ["sdpa-flash", "flex"])
    assert "1.50x" in text and "n/a" in text
    write_json(results, tmp_path / "b.json", {"device": "test"})
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["meta"]["device"] == "test" and len(data["results"]) == 6
    assert data["results"][2]["error"] == "needs torch.compile"
    pytest.importorskip("matplotlib")
    assert write_plot(results, tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 1000


def test_cli_needs_gpu() -> None:
    torch = pytest.importorskip("torch")
    from attnhub.cli import main

    res = CliRunner().invoke(main, ["bench", "--quick"])
    if torch.cuda.is_available():
        pytest.skip("has a GPU; the command is run on the device machine instead")
    assert res.exit_code != 0 and "CUDA" in res.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--peers", "sdpa-flash,nope"], "sdpa-math"),  # the error lists every peer, the extra one too
        (["--lengths", "4k"], "comma-separated integers"),
    ],
)
def test_cli_rejects_bad_options_before_needing_a_gpu(args, message) -> None:
    from attnhub.cli import main

    res = CliRunner().invoke(main, ["bench", *args])
    assert res.exit_code != 0 and message in res.output, res.output


def test_flex_peer_may_recompile_per_case() -> None:
    """Every bench case compiles FlexAttention anew; past dynamo's default limit of 8 recompiles torch
    would run it eagerly (~100x slower) and the peer's figures would be meaningless."""
    torch = pytest.importorskip("torch")
    from attnhub.bench.support import allow_recompiles

    cfg = torch._dynamo.config
    old = {n: getattr(cfg, n) for n in ("recompile_limit", "fail_on_recompile_limit_hit")}
    try:
        cfg.recompile_limit = 8
        allow_recompiles()
        assert cfg.recompile_limit >= 64 * 8  # far above the number of cases in the default grid
        assert cfg.fail_on_recompile_limit_hit is True
    finally:
        for n, v in old.items():
            setattr(cfg, n, v)
