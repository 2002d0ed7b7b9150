# Runs one standard-library module's own doctests in the guest, as `doctest.testmod(module)`
# would (default option flags, the module's globals), and reports each failing test by name.
# `module` is the run's variable; returns {"error": ...} when the module does not import,
# otherwise {"tests": n, "examples": n, "failed_examples": n, "failed": {test name: the start of
# its report}}.
import doctest
import importlib

try:
    mod = importlib.import_module(module)
except BaseException as e:  # noqa: BLE001 - the answer
    return {"error": f"{type(e).__name__}: {e}"}

finder = doctest.DocTestFinder(exclude_empty=True)
runner = doctest.DocTestRunner(verbose=False)
tests = examples = failed_examples = 0
failed = {}
for test in finder.find(mod, module):
    report = []
    if not test.examples:
        continue
    result = runner.run(test, out=report.append)
    tests += 1
    examples += result.attempted
    failed_examples += result.failed
    if result.failed:
        failed[test.name] = "".join(report)[:600]
return {"tests": tests, "examples": examples, "failed_examples": failed_examples, "failed": failed}
