# Records at install where libshardd is ($LIBSHARDD, else pkg-config's libdir), so a venv finds it without setup.
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py


def _libshardd_path():
    env = os.environ.get("LIBSHARDD")
    if env:
        return os.path.abspath(env)
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "shardd"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    path = os.path.join(libdir, "libshardd.so.0")
    return path if os.path.exists(path) else None


class BuildPyRecordingLibshardd(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "shardd", "_install.py")
        with open(target, "w") as f:
            f.write("# Written by setup.py at install: where libshardd was then.\n")
            f.write("LIBSHARDD = %r\n" % (_libshardd_path(),))


setup(cmdclass={"build_py": BuildPyRecordingLibshardd})
