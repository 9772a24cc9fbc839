"""``attnhub certify NAME``: run the conformance suite through pytest and print the support matrix."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import click
from rich.markup import escape

from attnhub import settings
from attnhub_conformance.parallel import run_sharded

FRAMEWORK_CHOICES = ("numpy", "torch", "tensorflow", "jax")
DEFAULT_EXAMPLES = 60


def _plugin_autoloaded() -> bool:
    """True when pytest loads our plugin by itself (the ``pytest11`` entry point is installed)."""
    if settings.external("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == "attnhub_conformance.plugin" for ep in metadata.entry_points(group="pytest11"))


def _command_line(
    name: str, quick: bool, seed: int, extra: str, cases: tuple[str, ...], features: tuple[str, ...] = ()
) -> str:
    parts = ["attnhub", "certify", name] + (["--quick"] if quick else []) + ["--seed", str(seed)]
    parts += [f"--case={c}" for c in cases] + [f"--feature='{f}'" for f in features]
    return " ".join(parts) + extra


@click.command(name="certify")
@click.argument("name")
@click.option("--quick", is_flag=True, help="A representative subset (CI); no randomised cases.")
@click.option(
    "--report",
    "report_prefix",
    type=click.Path(dir_okay=False),
    metavar="PREFIX",
    help="Write the report to PREFIX.json and PREFIX.md.",
)
@click.option("--seed", type=int, help="Seed of the inputs and randomised cases (printed; reproduces a run).")
@click.option("--case", "cases", multiple=True, metavar="ID", help="Run only this case (repeatable).")
@click.option(
    "--framework", type=click.Choice(FRAMEWORK_CHOICES), help="Inputs' framework (default: backend's first)."
)
@click.option("--device", help="Inputs' device, e.g. cpu or cuda (default: from the backend's device types).")
@click.option(
    "--examples", type=int, default=DEFAULT_EXAMPLES, show_default=True, help="Randomised cases (full mode)."
)
@click.option(
    "--feature", "features", multiple=True, help="Only the cases showing this matrix row (repeatable)."
)
@click.option("-v", "--verbose", is_flag=True, help="One line per case instead of pytest's dots.")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Processes sharing the cases (kernel compilation runs in parallel); same cases, one report.",
)
def certify(
    name: str,
    quick: bool,
    report_prefix: str | None,
    seed: int | None,
    cases: tuple[str, ...],
    framework: str | None,
    device: str | None,
    examples: int,
    features: tuple[str, ...],
    verbose: bool,
    jobs: int,
) -> None:
    """Certify backend NAME against the float64 reference (SPEC §6); non-zero exit if any accepted case fails."""
    _require_suite_dependencies()
    import pytest
    from rich.console import Console

    from attnhub.registry import REGISTRY
    from attnhub_conformance import report as rep

    console = Console(soft_wrap=True)
    table = REGISTRY.backends()
    if name not in table:
        errors = "".join(f"\n  plugin {e.plugin} failed to load: {e.error}" for e in REGISTRY.load_errors)
        raise click.ClickException(
            f"no backend named {name!r} is registered (registered: {', '.join(table) or 'none'}); "
            f"install its package so that it registers under the 'attnhub' entry-point group{errors}"
        )
    try:
        why = table[name].availability()
    except Exception as exc:
        why = f"availability() raised {type(exc).__name__}: {exc}"
    if why:
        raise click.ClickException(f"backend {name!r} is not available on this machine: {why}")
    # ATTNHUB_BACKEND would turn the suite's auto-dispatch checks into forced ones
    if settings.raw("ATTNHUB_BACKEND") is not None:
        console.print("[yellow]note: ignoring ATTNHUB_BACKEND while certifying[/]")
        del os.environ["ATTNHUB_BACKEND"]
    disabled = [n.strip() for n in (settings.raw("ATTNHUB_DISABLE") or "").split(",") if n.strip()]
    if name in disabled:  # a disabled backend would decline everything for that reason alone
        console.print(f"[yellow]note: certifying {name} although ATTNHUB_DISABLE lists it[/]")
        os.environ["ATTNHUB_DISABLE"] = ",".join(n for n in disabled if n != name)

    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") % 2**31
    extra = "".join(f" --{k} {v}" for k, v in (("framework", framework), ("device", device)) if v is not None)
    if examples != DEFAULT_EXAMPLES:
        extra += f" --examples {examples}"
    mode = "quick" if quick else "full"
    command = _command_line(name, quick, seed, extra, cases, features)
    console.print(f"[bold]attnhub certify {name}[/]: {mode} mode, seed {seed} (re-run exactly: {command})")

    suite = Path(__file__).with_name("suite.py")
    with tempfile.TemporaryDirectory(prefix="attnhub-certify-") as tmp:
        results = Path(tmp) / "results.json"
        args = [
            str(suite), "-c", os.devnull, "--rootdir", str(suite.parent), "-p", "no:cacheprovider", "--import-mode=importlib",
            "--assert=plain", "--tb=no", "-rN", "-W", "ignore::DeprecationWarning", "-v" if verbose and jobs == 1 else "-q",
            f"--attnhub-backend={name}", f"--attnhub-seed={seed}",
            f"--attnhub-examples={examples}", f"--attnhub-repro={extra}",
        ]  # fmt: skip
        if quick:
            args.append("--attnhub-quick")
        if framework:
            args.append(f"--attnhub-framework={framework}")
        if device:
            args.append(f"--attnhub-device={device}")
        args += [f"--attnhub-case={c}" for c in cases]
        args += [f"--attnhub-feature={f}" for f in features]
        if not _plugin_autoloaded():
            args += ["-p", "attnhub_conformance.plugin"]
        t0 = time.perf_counter()
        if jobs > 1:
            console.print(f"running in {jobs} processes; progress every 15 s")
            try:
                rc, payload = run_sharded(
                    args, jobs, Path(tmp), lambda line: console.print(line, highlight=False)
                )
            except RuntimeError as exc:
                raise click.ClickException(str(exc)) from None
            elapsed = time.perf_counter() - t0
        else:
            rc = pytest.main([*args, f"--attnhub-results={results}"])
            elapsed = time.perf_counter() - t0
            sys.stdout.flush()
            if not results.exists():
                raise click.ClickException(f"the suite did not run (pytest exit status {int(rc)})")
            payload = json.loads(results.read_text(encoding="utf-8"))

    report = rep.build_report(payload, elapsed, command)
    console.print(rep.rich_table(report))
    s = report["summary"]
    console.print(
        f"{s['cases']} cases: {s['passed']} pass, {s['failed']} FAIL, {s['declined']} declined "
        f"({report['device_description']}; {elapsed:.1f} s)"
    )
    console.print(escape(rep.frameworks_text(report)), highlight=False)
    if not cases and not features:  # a whole run: auto dispatch follows its verdict on this device
        from attnhub.profile import store_certify_report

        stored = store_certify_report(report)
        if stored is not None:
            console.print(f"verdict kept for auto dispatch: {escape(str(stored))}", highlight=False)
    if report_prefix:
        prefix = Path(report_prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{prefix}.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        Path(f"{prefix}.md").write_text(rep.markdown(report), encoding="utf-8")
        console.print(f"report: {prefix}.json, {prefix}.md")
    if report["failures"]:
        console.print(
            f"[bold red]{len(report['failures'])} accepted case(s) FAIL[/]; reproduce one alone with:"
        )
        for f in report["failures"][:50]:
            click.echo(click.style(f"  {f['id']}", fg="red") + f": {f['message']}")
            click.echo(f"    {f['repro']}")
        if len(report["failures"]) > 50:
            console.print(f"  ... and {len(report['failures']) - 50} more (see the report)")
        for line in rep.attribution(report):
            click.echo(f"  {line}" if line.startswith("-") else line)
        console.print(f"[bold red]{name}: FAILED[/] ({mode} mode, seed {seed}; re-run exactly: {command})")
        raise SystemExit(1)
    if int(rc) not in (0, 5):  # pytest failed outside the recorded cases (collection error, ...)
        raise click.ClickException(f"pytest exited with status {int(rc)} outside the recorded cases")
    if not s["passed"]:
        console.print(f"[yellow]{name} declined every case: it certifies nothing[/]")
    else:
        console.print(
            f"[bold green]{name}: certified[/] ({mode} mode, seed {seed}; re-run exactly: {command})"
        )


def _require_suite_dependencies() -> None:
    """The suite runs on pytest and hypothesis (the ``certify`` extra): say what to install, plainly."""
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"attnhub certify needs {' and '.join(missing)}, which are not installed here: "
            "pip install 'attnhub[certify]'"
        )


def main() -> None:  # pragma: no cover - `python -m attnhub_conformance.cli`
    certify()


if __name__ == "__main__":  # pragma: no cover
    main()
