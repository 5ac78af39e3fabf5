"""pip install . builds libvps.so with the Makefile and puts it, with the
configs, beside the module (pyproject.toml holds the rest).

setuptools builds in build/python (the Makefile's objects are in build/ as
make's own), so that nothing outside build/ is written to the tree."""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(ROOT, "build", "python")
ME = "vps: pip install"


def version():
    with open(os.path.join(ROOT, "include", "vps", "base.h")) as f:
        m = re.search(r'^#define VPS_VERSION_STRING "([^"]+)"', f.read(), re.M)
    if not m:
        sys.exit("%s: include/vps/base.h has no VPS_VERSION_STRING" % ME)
    return m.group(1)


def check_build_deps():
    """What building libvps needs, said before make fails on it less clearly."""
    cc = os.environ.get("CC", "cc")
    for tool in ("make", cc):
        if not shutil.which(tool):
            sys.exit("%s: building libvps.so needs %s, which is not on PATH (Debian: apt-get install build-essential)"
                     % (ME, tool))
    missing = [pkg for header, pkg in (("yaml.h", "libyaml-dev"), ("zstd.h", "libzstd-dev"))
               if subprocess.run([cc, "-E", "-"], input="#include <%s>\n" % header, text=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode]
    if missing:
        sys.exit("%s: building libvps.so needs the headers of %s: apt-get install %s (Debian, Ubuntu), or make deps "
                 "in the source tree" % (ME, " and ".join(p.split("-")[0] for p in missing), " ".join(missing)))


class BuildWithLibrary(build_py):
    """The module's files, then libvps.so (and libvps-cuda.so where nvcc
    is) from make python-lib, and configs/, beside them."""

    def run(self):
        # build/python outlives a build: what an earlier one put there (a
        # module since removed) must not reach this wheel
        shutil.rmtree(os.path.join(self.build_lib, "vps"), ignore_errors=True)
        super().run()
        check_build_deps()
        os.makedirs(BUILD, exist_ok=True)
        # the Makefile's deps step would also want the test tools (bats,
        # groff, ...); the library needs only what check_build_deps saw
        deps_ok = os.path.join(BUILD, ".deps-ok")
        open(deps_ok, "w").close()
        jobs = [] if "-j" in os.environ.get("MAKEFLAGS", "") else ["-j%d" % (os.cpu_count() or 1)]
        # the plain build in build/, whatever the environment says: a
        # sanitized libvps.so cannot be loaded by Python
        subprocess.run(["make", "-C", ROOT, "--no-print-directory"] + jobs +
                       ["BUILDDIR=build", "SANITIZE=", "DEPS_STAMP=" + deps_ok, "python-lib"], check=True)
        dest = os.path.join(self.build_lib, "vps")
        shutil.copy(os.path.join(ROOT, "build", "libvps.so.%s" % version()), os.path.join(dest, "libvps.so"))
        cuda = os.path.join(ROOT, "build", "libvps-cuda.so")
        if os.path.exists(cuda):
            shutil.copy(cuda, dest)
        shutil.copytree(os.path.join(ROOT, "configs"), os.path.join(dest, "configs"))


class Wheel(bdist_wheel):
    """A wheel for any Python 3 on this platform: the module is ctypes, the
    library is C."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


os.makedirs(BUILD, exist_ok=True)
setup(version=version(), cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": Wheel},
      options={"build": {"build_base": BUILD}, "egg_info": {"egg_base": BUILD}})
