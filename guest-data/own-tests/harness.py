"""Runs a listed subset of a package's own test suite (numpy's, pandas') inside pycage's
data guest.

The run's variables: ``SUITES``, the test paths to run; ``PACKAGES``, the guest's packages
whose test packages come from this directory; ``EXPECTED``, the file of expected failures;
``ARGS``, pytest's further arguments.
The run's working directory holds ``suite.tar`` (the package's test files from its sdist, and
the wheels of pytest and hypothesis) and the expected-failures file. The wheels are unpacked
here and put on ``sys.path``; the test packages are found beside the guest's own by adding this
directory's copies to each of ``PACKAGES``' ``__path__``. The run returns what happened: counts
per suite, the failures no line of the list expects, and the lines that expected a failure
that did not happen. Only the harness adapts, never the packages' tests: what the guest lacks
(``ctypes``, ``mmap``, file descriptors to capture, ``/dev/null``, a user id) is either
stubbed so that only the tests that use it fail, or turned off in pytest.
"""

import os
import re
import sys
import tarfile
import types
import zipfile

# SUITES, PACKAGES, EXPECTED and ARGS (pytest's further arguments) are variables of the run
# (`--var SUITES=[...]`).

tarfile.open("suite.tar").extractall(".", filter="data")
root = os.getcwd()
site = os.path.join(root, "site")
for wheel in sorted(os.listdir("wheels")):
    with zipfile.ZipFile(os.path.join("wheels", wheel)) as z:
        z.extractall(site)
sys.path.insert(0, site)
# The guest has no /tmp: temporary files go to the working directory, within its budgets.
os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
os.environ["TMPDIR"] = os.path.join(root, "tmp")

import importlib  # noqa: E402

for name in PACKAGES:  # noqa: F821
    package = importlib.import_module(name)
    package.__path__.append(os.path.join(root, *name.split(".")))


class Missing(types.ModuleType):
    """A module the guest does not have, imported at the top of a test file: the file is
    collected, and the tests that use it fail with this error (listed as expected)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            # What tools ask of every module (hypothesis looks for `__file__`).
            raise AttributeError(name)
        raise ImportError(f"{self.__name__} is not in the wasm guest")


for name in ("ctypes", "mmap"):
    sys.modules[name] = Missing(name)

expected = []
with open(EXPECTED) as f:  # noqa: F821
    for line in f:
        line = line.strip()
        if line and not line.startswith("#"):
            pattern, _, reason = line.partition("  ")
            # `*` is any text; everything else, `[` of a parametrized id included, is itself.
            regex = re.compile(".*".join(map(re.escape, pattern.split("*"))))
            expected.append((regex, reason.strip()))


class Outcomes:
    """A pytest plugin that records each test's outcome."""

    def __init__(self):
        self.counts = {}
        self.failures = {}

    def pytest_runtest_logreport(self, report):
        suite = next((s for s in SUITES if report.nodeid.startswith(s)), "?")  # noqa: F821
        counts = self.counts.setdefault(suite, {})
        if report.failed:
            line = str(report.longrepr).strip().splitlines()
            self.failures[report.nodeid] = line[-1][:300] if line else ""
            outcome = "failed" if report.when == "call" else "error"
        elif report.when == "call" and hasattr(report, "wasxfail"):
            outcome = "xfailed"
        elif report.skipped:
            outcome = "skipped"
        elif report.when == "call":
            outcome = "passed"
        else:
            return
        counts[outcome] = counts.get(outcome, 0) + 1


import pytest  # noqa: E402

outcomes = Outcomes()
code = pytest.main(
    [
        "-q",
        "--rootdir",
        root,
        "--basetemp",
        os.path.join(root, "pytest-tmp"),
        "-o",
        "addopts=",
        "--import-mode=importlib",
        "--assert=plain",
        "--capture=sys",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:faulthandler",
        "-p",
        "no:logging",
        "--tb=no",
        *ARGS,  # noqa: F821
        *SUITES,  # noqa: F821
    ],
    plugins=[outcomes],
)


def expects(nodeid):
    return any(regex.fullmatch(nodeid) for regex, _ in expected)


return {
    "exit": int(code),
    "counts": outcomes.counts,
    "expected_failures": sum(1 for n in outcomes.failures if expects(n)),
    "unexpected": {n: why for n, why in outcomes.failures.items() if not expects(n)},
    "stale": [
        regex.pattern
        for regex, _ in expected
        if not any(regex.fullmatch(n) for n in outcomes.failures)
    ],
}
