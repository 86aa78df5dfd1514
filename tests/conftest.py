"""Shared pytest setup: nothing a test runs reads or writes the host's own gpugate.

The host may have gpugate installed and configured (issue 26): its parsed-YAML cache
(/var/cache/gpugate), its site file (/etc/gpugate/gpugate.yaml) and the state directory a hook
with a broken config logs to (/var/lib/gpugate) are replaced by the test run's own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import paths
import pytest

_private: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    """The run's own cache, fallback state and (absent) site file, before anything is collected:
    a test module that loads a config when imported (a module-level `CFG = ...`) runs at
    collection, before any fixture; with the places set in a session fixture it wrote the
    host's /var/cache/gpugate as root (found by watching /var/cache in a CI run)."""
    import gpugate.config
    from gpugate.gate.guard import FALLBACK_ENV

    base = tempfile.mkdtemp(prefix="gpugate-tests-")
    _private["base"] = base
    for name in ("yamlcache", "fallback-state", "no-site"):
        os.mkdir(os.path.join(base, name))
    os.environ["GPUGATE_CACHE_DIR"] = os.path.join(base, "yamlcache")
    os.environ[FALLBACK_ENV] = os.path.join(base, "fallback-state")
    os.environ.pop("GPUGATE_CONFIG", None)
    # No --config and no GPUGATE_CONFIG means the packaged defaults, never the host's site file.
    _private["site_file"] = gpugate.config.DEFAULT_SITE_FILE
    gpugate.config.DEFAULT_SITE_FILE = os.path.join(base, "no-site", "gpugate.yaml")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put the site file's name back and remove the run's private places."""
    import gpugate.config

    if "site_file" in _private:
        gpugate.config.DEFAULT_SITE_FILE = _private["site_file"]
    if "base" in _private:
        shutil.rmtree(_private["base"], ignore_errors=True)


@pytest.fixture(autouse=True)
def qualifications_started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The suspect qualifications a test's hooks asked for, recorded instead of started.

    A flag starts `gpugate qualify` in a detached child (gpugate/gate/suspicion.py): in a unit
    test that child would outlive it and talk to whatever Slurm the host has. The end-to-end
    tests run the hooks in their own processes, where the real child starts.
    """
    from gpugate.gate import suspicion

    calls: list[tuple[str, str]] = []

    def start(config: object, node: str, trigger: str) -> int:
        calls.append((node, trigger))
        return 4242

    monkeypatch.setattr(suspicion, "start_qualification", start)
    return calls


@pytest.fixture(autouse=True)
def repair_qualifications_started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict]]:
    """The repair ladder's qualifications a test's health runs asked for, recorded instead of
    started (gpugate/gate/ladder.py starts them in a detached child, default gpugate.child.detach,
    which would outlive the test and load the host's config); a test that passes its own
    `detach` sees its own calls."""
    from gpugate.gate import ladder

    calls: list[tuple[str, dict]] = []

    def start(task: str, kwargs: dict, timeout: float) -> int:
        calls.append((task, kwargs))
        return 4242

    monkeypatch.setattr(ladder, "detach", start)
    return calls


# --- the end-to-end tests' sites on a real local Slurm (tests/support/e2e.py) -------------------------
@pytest.fixture(scope="module")
def slurm_site(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """A factory of gpugate sites, each with its local Slurm started (tests/support/e2e.py SlurmSites);
    every cluster it started is stopped when the module ends."""
    from e2e import SlurmSites

    name = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", "-")
    sites = SlurmSites(tmp_path_factory, name)
    try:
        yield sites
    finally:
        sites.stop()


@pytest.fixture(scope="module")
def site(e2e_site):
    """The module's site: its `e2e_site` fixture (a `slurm_site(...)` call) names it."""
    return e2e_site.site


@pytest.fixture(scope="module")
def cluster(e2e_site):
    """The module's local Slurm, running: its `e2e_site` fixture names it."""
    return e2e_site.cluster


@pytest.fixture
def open_tmp(tmp_path):
    """pytest's tmp dirs are 0700: open them to be traversed, as an install's directories are."""
    for directory in (tmp_path, *tmp_path.parents):
        mode = directory.stat().st_mode
        if not mode & 0o001 and directory.stat().st_uid == os.geteuid():
            directory.chmod((mode & 0o7777) | 0o001)


# --- what the run could not see: ../shared (issue 40, deliver 4) ----------------------------
# The corpus, the real captures and the reference outputs lie in ../shared beside the checkout,
# read in place, never copied. Their tests carry `@pytest.mark.shared(KIND)` and skip where it is
# absent; the summary says how many ran, and under CI=true a skipped one fails the run.
SHARED = str(paths.SHARED)
_shared_counts: dict[str, dict[str, int]] = {}  # kind -> {"ran": n, "skipped": n}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `-m "not slow"` sees the marks added
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tag each test that reads ../shared with its kind, in its reports' user_properties
    (which pytest-xdist's workers send to the process that counts); mark each end-to-end test
    (`slurm`: a real Slurm takes seconds to start and to run a job) `slow`."""
    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.slow)
        marker = item.get_closest_marker("shared")
        if marker is not None:
            item.user_properties.append(("shared", marker.args[0] if marker.args else "shared"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each test of ../shared once: skipped (at set-up or in its body), or ran."""
    kind = dict(report.user_properties).get("shared")
    if kind is None and report.skipped and _names_shared(str(report.longrepr)):
        kind = "unmarked"  # a test that reads ../shared without saying so: still counted
    if kind is None or report.when == "teardown" or (report.when == "setup" and not report.skipped):
        return
    counts = _shared_counts.setdefault(str(kind), {"ran": 0, "skipped": 0})
    ran = not report.skipped or hasattr(report, "wasxfail")  # an xfail ran, and failed as known
    counts["ran" if ran else "skipped"] += 1


def _names_shared(reason: str) -> bool:
    """Whether a skip's reason names a path into ../shared (not merely the words, as
    "pyslurm is not installed (.ci/pyslurm builds it from ../shared/vendor/pyslurm)" does)."""
    return SHARED + os.sep in reason or f"{os.sep}..{os.sep}shared{os.sep}" in reason


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line: was ../shared found, and how many of its tests ran or skipped, by kind."""
    if not _shared_counts:
        return
    found = f"found at {SHARED}" if os.path.isdir(SHARED) else f"NOT found (looked at {SHARED})"
    parts = [f"{kind} {c['ran']} ran, {c['skipped']} skipped"
             for kind, c in sorted(_shared_counts.items())]  # fmt: skip
    terminalreporter.write_line(f"../shared: {found}; its tests: {'; '.join(parts)}")


# --- the host's own gpugate: never written (issue 26) -----------------------------------------
# A hook or a command run as root without GPUGATE_CACHE_DIR, a config or a state directory of
# its own writes the host's. Which of these places existed when the run began is noted by the
# process that counts (pytest-xdist's workers have `workerinput`); a new one fails the run under
# CI=true, where nothing else runs on the machine (elsewhere another program may have made it).
HOST_PLACES = ("/etc/gpugate", "/var/lib/gpugate", "/var/cache/gpugate")
_host_before: dict[str, bool] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note which of the host's gpugate places exist before anything runs."""
    if not hasattr(session.config, "workerinput"):
        _host_before.update((path, os.path.lexists(path)) for path in HOST_PLACES)


def host_places_made() -> list[str]:
    """The host's gpugate places that did not exist when the run began and exist now."""
    return [path for path, was in _host_before.items() if not was and os.path.lexists(path)]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under CI=true, a test of ../shared that skipped fails the run: CI must see them all;
    so does a place of the host's own gpugate that the run made."""
    skipped = sum(c["skipped"] for c in _shared_counts.values())
    if os.environ.get("CI") == "true" and skipped and session.exitstatus == 0:
        print(f"\nCI=true: {skipped} test(s) of ../shared skipped ({SHARED}): failing the run")
        session.exitstatus = 1
    made = host_places_made()
    if made:
        names = ", ".join(f"{p} ({', '.join(sorted(os.listdir(p))[:5])})" if os.path.isdir(p)
                          else p for p in made)  # fmt: skip
        print(f"\nthe run wrote the host's own gpugate: {names}; a test ran gpugate as root "
              "without GPUGATE_CACHE_DIR, a config or a state directory of its own")  # fmt: skip
        if os.environ.get("CI") == "true" and session.exitstatus == 0:
            session.exitstatus = 1


@pytest.fixture
def default_dump_place() -> Iterator[None]:
    """PyTorch's default dump place, /tmp/nccl_trace_rank_<r>, is one per node: the tests that
    write there take turns (xdist runs their modules at once, and a job's epilog reads, then
    removes, every dump of its user there that is newer than the job: another test's too)."""
    import fcntl

    with open("/tmp/gpugate-tests-default-dump-place.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
