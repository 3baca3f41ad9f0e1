# A real shardd on a temporary folder for the binding's tests: started from SHARDD_BIN, stopped with SIGTERM.
import os
import shutil
import signal
import subprocess
import tempfile
import time

WAIT = 30  # seconds; every wait is bounded so a broken daemon fails the test instead of hanging it


class Daemon:
    """A shardd on a fresh temporary folder; `root` and `args` (e.g. --peer-listen) share or add.

    wrap: a command the daemon runs under (["ip", "netns", "exec", NS]: one that execs it, so
    proc.pid stays the daemon's); env: variables added; tmp: a folder shared with other
    daemons, whose socket and log are then NAME.sock and NAME.log and which stop() leaves.
    """

    def __init__(self, root=None, args=(), wrap=(), env=None, tmp=None, name="shardd"):
        self.owns_tmp = tmp is None
        self.tmp = tmp or tempfile.mkdtemp(prefix="shardd-py-")
        self.root = root or os.path.join(self.tmp, "root")
        self.socket = os.path.join(self.tmp, name + ".sock")
        self.log = open(os.path.join(self.tmp, name + ".log"), "w+")
        exe = os.environ.get("SHARDD_BIN")
        if not exe:
            raise SystemExit("SHARDD_BIN is not set")
        self.proc = subprocess.Popen(list(wrap) + [exe, "--root", self.root, "--socket", self.socket] + list(args),
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        deadline = time.monotonic() + WAIT
        # The socket appears only once the daemon accepts.
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("%s did not start:\n%s" % (name, self.logtext()))
            time.sleep(0.02)

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.proc.send_signal(signal.SIGCONT)  # a stopped daemon acts on nothing else
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.final_log = self.logtext()
        self.log.close()
        if self.owns_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return rc
