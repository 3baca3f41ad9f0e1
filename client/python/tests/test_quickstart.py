#!/usr/bin/env python3
# README's shell commands ("Start a daemon", "From PyTorch"), extracted from README.md and run as written; the docs' links; the venv's installed shardd.
"""Exits 77 (skipped) without the project's venv (.venv/bin/torchrun).

The commands run in a fresh clone after scripts/demo, as near as the suite can make one: a git
clone of this tree's committed HEAD (its README's commands are the ones run), whose build/ and
.venv/ are this build tree and the project's venv, which is what scripts/demo leaves there (its
build, and the venv holding shardd with that build's library recorded). Out of a git checkout
(a source tarball) the clone is a folder whose client/ is this tree's. scripts/demo itself is
not run: it builds the whole tree again in the clone (minutes on the suite's 2 cores), writes
1 GiB, and would pip-install the clone's shardd into the shared venv, recording a library
deleted with the clone. What it prints last, the commands to try next, is checked against
README's. The commands
name /tmp/ckpt and /tmp/shardd.sock, and torchrun's default port; as root they run in namespaces
of their own (a private /tmp, into which a tree that lives under /tmp is bound back, and a
network with only loopback), so that several runs of the suite
never meet there. Without root those two paths are the only
text changed (into a private folder), and the test says so.

`scripts/test`, README's other command, is what runs this suite.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import suite

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
SOURCE = os.path.dirname(os.path.dirname(PYTHON_DIR))
README = os.path.join(SOURCE, "README.md")
VENV = os.path.join(SOURCE, ".venv")
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(os.environ.get("LIBSHARDD", "build/client/x"))))
SECTIONS = ("Start a daemon", "From PyTorch")


def section(text, title):
    """The text of README's `## title` section, up to the next `## `."""
    m = re.search(r"^## %s\n(.*?)(?=^## |\Z)" % re.escape(title), text, re.S | re.M)
    if not m:
        raise AssertionError("README.md has no section '## %s'" % title)
    return m.group(1)


def shell_commands(text):
    """Every line of the section's ```sh blocks, in order."""
    lines = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        lines += [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return lines


def socket_of(command):
    m = re.search(r"--socket (\S+)", command)
    return m.group(1) if m else None


# Runs the commands one by one as a user at a shell would: a line ending in `&` starts in the
# background, and the next line waits (as a person would, briefly) for the socket it named.
RUNNER = r"""
import os, re, subprocess, sys, time
lines, sockets = sys.argv[2:], []
background = []
status = 0
try:
    for line in lines:
        print("$ " + line, flush=True)
        if line.rstrip().endswith("&"):
            background.append(subprocess.Popen(["bash", "-c", line.rstrip()[:-1]]))
            m = re.search(r"--socket (\S+)", line)
            deadline = time.monotonic() + 30
            while m and not os.path.exists(m.group(1)) and time.monotonic() < deadline:
                time.sleep(0.05)
            continue
        rc = subprocess.run(["bash", "-c", line]).returncode
        if rc != 0:
            print("exit status %d" % rc, flush=True)
            status = 1
            break
finally:
    for p in background:
        p.terminate()
        p.wait()
sys.exit(status)
"""


def fresh_clone(clone):
    """This tree's committed HEAD checked out into clone (True), or False out of a git checkout."""
    head = subprocess.run(["git", "-C", SOURCE, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return False
    for argv in (["git", "init", "-q", clone],
                 ["git", "-C", clone, "fetch", "-q", "--depth", "1", "file://" + SOURCE, head.stdout.strip()],
                 ["git", "-C", clone, "checkout", "-q", "FETCH_HEAD"]):
        subprocess.run(argv, check=True, capture_output=True)
    return True


def demo_next_steps():
    """The commands scripts/demo prints last, its venv path written as README writes it."""
    text = open(os.path.join(SOURCE, "scripts", "demo")).read()
    block = text[text.index("try it yourself:"):].split("\nEOF", 1)[0].splitlines()[1:]
    return [ln.strip().replace("$SHARDD_VENV/", ".venv/") for ln in block if not ln.strip().startswith("cd ")]


class Quickstart(unittest.TestCase):
    def test_demo_prints_readmes_commands(self):
        text = open(README).read()
        readme = [c for title in SECTIONS for c in shell_commands(section(text, title))]
        printed = demo_next_steps()
        self.assertTrue(printed)
        for line in printed:
            self.assertIn(line, readme, "scripts/demo prints a command README does not give")

    def test_readme_commands_run_as_written(self):
        clone = tempfile.mkdtemp(prefix="quickstart-", dir=BUILD)
        cleanups = []
        try:
            cloned = fresh_clone(clone)
            if not cloned:
                os.symlink(os.path.join(SOURCE, "client"), os.path.join(clone, "client"))
                shutil.copy(README, clone)
            print("commands run in %s" % ("a git clone of HEAD" if cloned else "a folder of this tree's client/"))
            os.symlink(BUILD, os.path.join(clone, "build"))
            os.symlink(VENV, os.path.join(clone, ".venv"))
            text = open(os.path.join(clone, "README.md")).read()
            commands = []
            for title in SECTIONS:
                found = shell_commands(section(text, title))
                self.assertTrue(found, "README's '%s' has no sh block" % title)
                commands += found
            argv = [sys.executable, "-c", RUNNER, "-"]
            if os.geteuid() == 0 and shutil.which("unshare"):
                # A private /tmp (tmpfs) for the commands only: their /tmp/ckpt is nobody else's.
                # Its own network too: torchrun's default port 29500 is nobody else's either.
                # A tree that lives under /tmp (a clone made there) is bound back into the new one.
                tops = sorted({os.path.realpath(d).split("/")[2] for d in (SOURCE, BUILD, VENV, sys.executable)
                               if os.path.realpath(d).startswith("/tmp/")})
                hold = tempfile.mkdtemp(prefix="quickstart-tmp-", dir="/dev/shm" if os.path.isdir("/dev/shm") else BUILD)
                cleanups.append(lambda: os.rmdir(hold))
                rebind = "".join(' && mkdir -p "/tmp/%s" && mount --bind "%s/%s" "/tmp/%s"' % (t, hold, t, t)
                                 for t in tops)
                argv = ["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c",
                        'ip link set lo up && mount --bind /tmp "%s" && mount -t tmpfs tmpfs /tmp%s && exec "$@"'
                        % (hold, rebind), "-"] + argv
            else:
                private = os.path.join(clone, "tmp")
                os.mkdir(private)
                print("not root: /tmp/ in the commands is %s/ here" % private)
                commands = [c.replace("/tmp/", private + "/") for c in commands]
            p = subprocess.run(argv + commands, cwd=clone, capture_output=True, text=True, timeout=600,
                               env=dict(os.environ, SHARDD_SOCKET="", GLOO_SOCKET_IFNAME="lo"))
            print(p.stdout[-3000:])
            self.assertEqual(p.returncode, 0, p.stdout[-4000:] + p.stderr[-4000:])
            # What the example and the deep verify say when they succeed.
            self.assertIn("bit-equal to the trained model", p.stdout)
            self.assertRegex(p.stdout, r"ok: .*run1/step-6")
        finally:
            shutil.rmtree(clone, ignore_errors=True)
            for cleanup in cleanups:
                cleanup()

    def test_docs_links_and_length(self):
        text = open(README).read()
        self.assertLessEqual(text.count("\n"), 200, "README.md is a front page: at most ~200 lines")
        pages = [README] + [os.path.join(SOURCE, "docs", f) for f in sorted(os.listdir(os.path.join(SOURCE, "docs")))]
        for page in pages:
            body = open(page).read()
            for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", body):
                path = os.path.normpath(os.path.join(os.path.dirname(page), target))
                self.assertTrue(os.path.exists(path), "%s links to %s, which does not exist" % (page, target))
            for named in re.findall(r"`((?:docs|client|tests|scripts|proto|daemon)/[\w./-]+\.(?:md|py|c|h))`", body):
                self.assertTrue(os.path.exists(os.path.join(SOURCE, named)), "%s names %s, which does not exist"
                                % (page, named))

    def test_installed_package(self):
        """The venv's own shardd (scripts/test and scripts/demo install it): found with no PYTHONPATH
        and no LIBSHARDD, its recorded library exists; PYTHONPATH still wins over it."""
        python = os.path.join(VENV, "bin", "python")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LIBSHARDD")}
        probe = "import shardd, os; print(shardd.__file__); print(shardd.library_path())"
        p = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, cwd="/")
        if p.returncode != 0 and "No module named 'shardd'" in p.stderr:
            self.skipTest("the venv holds no shardd yet (scripts/test or scripts/demo installs it)")
        self.assertEqual(p.returncode, 0, p.stderr)
        module, library = p.stdout.split("\n")[:2]
        self.assertIn("site-packages", module)
        self.assertTrue(os.path.exists(library), library)
        p = subprocess.run([python, "-c", probe], env=dict(env, PYTHONPATH=PYTHON_DIR), capture_output=True,
                           text=True, cwd="/")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith(os.path.join(PYTHON_DIR, "shardd")), p.stdout)


def main():
    if not os.path.exists(os.path.join(VENV, "bin", "torchrun")):
        print("the project's venv (%s) is missing: skipping (scripts/test makes it)" % VENV)
        return 77
    return suite.run(__name__)


if __name__ == "__main__":
    sys.exit(main())
