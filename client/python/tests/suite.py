# The one way the binding's test scripts run: a worker invocation, or the module's unittest cases (with the daemons they use) and a closing count.
import json
import sys
import unittest


def run(module_name, worker=None, flag="--worker", daemons=None, after=None):
    """Exit status of the test script `module_name`: `script FLAG JSON` runs worker(args) (one rank,
    whose return value is the status); otherwise every test case of the module runs, and the last
    line says how many passed and failed.

    daemons: called before the cases, returns the daemons they use; each is stopped afterwards, one
    that exits non-zero counts as a failure, and on any failure each one's log is printed.
    after: called once the daemons are stopped; prints what it has to say and returns how many
    further failures there are."""
    if worker is not None and len(sys.argv) == 3 and sys.argv[1] == flag:
        return worker(json.loads(sys.argv[2]))
    started = daemons() if daemons else []
    passed, failed = 0, 1
    try:
        suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module_name])
        result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
        failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
        passed = result.testsRun - failed - len(result.skipped)
        for test, why in result.skipped:
            print("skipped %s: %s" % (test.id().split(".")[-1], why))
    finally:
        rcs = [d.stop() for d in started]
    for d, rc in zip(started, rcs):
        if rc != 0 or failed:
            # The daemon's side of the story, for whoever reads the failure.
            print("shardd exited %d; its log:\n%s" % (rc, d.final_log))
    failed += sum(rc != 0 for rc in rcs)
    if after:
        failed += after()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0
