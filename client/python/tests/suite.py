# The one way the binding's test scripts run: a worker invocation, or the module's unittest cases with a closing count.
import json
import sys
import unittest


def run(module_name, worker=None, flag="--worker"):
    """Exit status of the test script `module_name`: `script FLAG JSON` runs worker(args) (one rank,
    whose return value is the status); otherwise every test case of the module runs, and the last
    line says how many passed and failed."""
    if worker is not None and len(sys.argv) == 3 and sys.argv[1] == flag:
        return worker(json.loads(sys.argv[2]))
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module_name])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    print("%d passed, %d failed" % (result.testsRun - failed - len(result.skipped), failed))
    return 1 if failed else 0
