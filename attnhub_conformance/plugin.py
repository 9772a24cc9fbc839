"""The pytest plugin: ``--attnhub-*`` options, fixtures and the parametrisation of the suite.

Loaded in every pytest run of an environment with attnhub (entry point ``pytest11``), it stays
inert unless ``--attnhub-backend`` is given: it only adds options and fixtures, and parametrises
nothing but the tests of :mod:`attnhub_conformance.suite`. ``attnhub certify`` drives it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class SuiteState:
    """What one certify session runs: the certifier, the grid and the randomised settings."""

    certifier: Any
    cases: list[Any]
    mode: str
    random_examples: int
    wanted: frozenset[str]
    shard: tuple[int, int] = (0, 1)
    written: set[str] = dataclasses.field(default_factory=set)  # ids already in <results>.partial
    #: The declared frameworks whose cases run, and those that do not, each with the reason.
    frameworks_run: list[str] = dataclasses.field(default_factory=list)
    frameworks_not_run: dict[str, str] = dataclasses.field(default_factory=dict)

    def wants(self, case_id: str) -> bool:
        return not self.wanted or case_id in self.wanted

    def owns(self, draw: int) -> bool:
        """Whether this shard runs the ``draw``-th randomised case (``--attnhub-shard i/n``)."""
        return draw % self.shard[1] == self.shard[0]

    @property
    def random_enabled(self) -> bool:
        if self.wanted:
            return any(w.startswith("random-") for w in self.wanted)
        return self.mode == "full" and self.random_examples > 0


STATE = pytest.StashKey[SuiteState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("attnhub", "attnhub conformance suite (driven by `attnhub certify`)")
    g.addoption("--attnhub-backend", default=None, metavar="NAME", help="backend to certify")
    g.addoption("--attnhub-quick", action="store_true", help="the quick grid (no randomised cases)")
    g.addoption("--attnhub-seed", type=int, default=None, help="seed of inputs and randomised cases")
    g.addoption("--attnhub-case", action="append", default=[], metavar="ID", help="run only this case")
    g.addoption(
        "--attnhub-framework",
        default=None,
        help="framework of the inputs, and the only one run (default: every declared one, the first in full)",
    )
    g.addoption("--attnhub-device", default=None, help="device of the inputs (default: from device_types)")
    g.addoption("--attnhub-examples", type=int, default=60, help="randomised cases in full mode")
    g.addoption("--attnhub-feature", action="append", default=[], help="keep only cases with this feature")
    g.addoption("--attnhub-results", default=None, metavar="PATH", help="write the results as JSON")
    g.addoption("--attnhub-repro", default=None, help="(certify) options appended to reproduce commands")
    g.addoption(
        "--attnhub-shard",
        default=None,
        metavar="I/N",
        help="(certify --jobs) run every N-th case from the I-th",
    )


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("attnhub_backend", None)
    if not name:
        return
    from attnhub_conformance.runner import Certifier

    seed = config.getoption("attnhub_seed")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") % 2**31
    try:
        cert = Certifier(
            name,
            seed=seed,
            framework=config.getoption("attnhub_framework"),
            device=config.getoption("attnhub_device"),
        )
    except KeyError:
        raise pytest.UsageError(f"no backend named {name!r} is registered") from None
    except (ImportError, ValueError, RuntimeError) as exc:
        raise pytest.UsageError(f"cannot build inputs for {name!r}: {exc}") from None
    repro = config.getoption("attnhub_repro")
    if repro:
        cert.repro_extra = repro
    quick = bool(config.getoption("attnhub_quick"))
    dtypes = tuple(cert.backend.dtypes)
    run, not_run = _frameworks(cert, explicit=config.getoption("attnhub_framework") is not None)
    grid = _grid(quick, dtypes, cert.framework, run[1:])
    feats = set(config.getoption("attnhub_feature"))
    if feats:
        grid = [c for c in grid if feats & set(cert.features(c))]
    wanted = frozenset(config.getoption("attnhub_case"))
    cases = [c for c in grid if not wanted or c.id in wanted]
    if wanted and not cases and not any(w.startswith("random-") for w in wanted):
        # a case id from the other mode: look it up in both grids
        other = _grid(True, dtypes, cert.framework, run[1:]) + _grid(False, dtypes, cert.framework, run[1:])
        cases = list({c.id: c for c in other if c.id in wanted}.values())
    shard = _parse_shard(config.getoption("attnhub_shard"))
    config.stash[STATE] = SuiteState(
        cert, cases[shard[0] :: shard[1]], "quick" if quick else "full", int(config.getoption("attnhub_examples")),
        wanted, shard, frameworks_run=run, frameworks_not_run=not_run,
    )  # fmt: skip


def _frameworks(cert: Any, explicit: bool) -> tuple[list[str], dict[str, str]]:
    """(frameworks whose cases run, the main one first; {declared framework not run: why})."""
    run, not_run = [cert.framework], {}
    for fw in cert.backend.frameworks:
        if fw == cert.framework:
            continue
        if explicit:
            not_run[fw] = f"--framework {cert.framework} runs that framework only"
            continue
        try:
            cert.ops_for(fw)
        except (ImportError, ValueError, RuntimeError) as exc:
            not_run[fw] = f"cannot build {fw} inputs on {cert.device}: {exc}"
            continue
        run.append(fw)
    return run, not_run


def _grid(quick: bool, dtypes: tuple[str, ...], main: str, others: list[str]) -> list[Any]:
    """The main framework's grid, then each other framework's cases (quick: a subset of the quick
    grid's; full: the whole quick grid)."""
    from attnhub_conformance.cases import full_grid, quick_grid, secondary_grid

    cases = (quick_grid if quick else full_grid)(dtypes, main)
    for fw in others:
        more = secondary_grid(dtypes, fw) if quick else quick_grid(dtypes, fw)
        cases += [dataclasses.replace(c, framework=fw) for c in more]
    return cases


def _parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/n"`` -> (i, n) with 0 <= i < n; None -> (0, 1)."""
    if not text:
        return (0, 1)
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--attnhub-shard takes I/N (two integers), got {text!r}") from None
    if not 0 <= i < n:
        raise pytest.UsageError(f"--attnhub-shard I/N needs 0 <= I < N, got {text!r}")
    return (i, n)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(STATE, None)
    if state is None:
        return []
    from attnhub_conformance.report import frameworks_text

    c = state.certifier
    return [
        f"attnhub certify: backend {c.name}, {state.mode} mode, {len(state.cases)} grid cases"
        f"{f' + {state.random_examples} randomised' if state.random_enabled else ''}, "
        f"framework {c.framework}, device {c.device}, seed {c.seed}",
        frameworks_text(
            {"frameworks_run": state.frameworks_run, "frameworks_not_run": state.frameworks_not_run}
        ),
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attnhub_case" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(STATE, None)
    cases = state.cases if state else []
    metafunc.parametrize("attnhub_case", cases, ids=[c.id for c in cases])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    drop = [
        it
        for it in items
        if getattr(it, "originalname", it.name) == "test_random_cases" and not state.random_enabled
    ]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if it not in drop]


@pytest.fixture(scope="session")
def attnhub_suite(request: pytest.FixtureRequest) -> SuiteState:
    """The certify session's state; the suite's tests skip without ``--attnhub-backend``."""
    state = request.config.stash.get(STATE, None)
    if state is None:
        pytest.skip("the conformance suite runs through `attnhub certify NAME` (or --attnhub-backend NAME)")
    return state


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Append the results recorded since the last test to ``<results>.partial`` (JSON lines): a
    run cut off by a time limit still tells ``certify --jobs`` what passed and what failed."""
    state = item.config.stash.get(STATE, None)
    path = item.config.getoption("attnhub_results", None)
    if state is None or not path:
        return
    fresh = [r for rid, r in state.certifier.results.items() if rid not in state.written]
    if fresh:
        with open(f"{path}.partial", "a", encoding="utf-8") as fh:
            for r in fresh:
                fh.write(json.dumps(dataclasses.asdict(r)) + "\n")
                state.written.add(r.id)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(STATE, None)
    path = session.config.getoption("attnhub_results", None)
    if state is None or not path:
        return
    c = state.certifier
    payload = {
        "backend": c.name,
        "mode": state.mode,
        "seed": c.seed,
        "framework": c.framework,
        "frameworks_run": state.frameworks_run,
        "frameworks_not_run": state.frameworks_not_run,
        "device": c.device,
        "random_examples": state.random_examples if state.random_enabled else 0,
        "results": [dataclasses.asdict(r) for r in c.results.values()],
    }
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
