"""pip install . (or pip wheel ., python -m build): the attn_h package — python/attn_h.py as
attn_h/__init__.py, attn.h, and libattn.so built from python/attn_shared.c with the system C
compiler ($CC, else cc) at install time. No compiled Python extension and no CUDA SDK: the
library loads CUDA, NVRTC and cuBLAS at run time as the header does. The wheel is tagged for
the platform (it holds a native library) but for any Python 3 (the library does not link
Python)."""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def header_version():
    with open(os.path.join(ROOT, "attn.h"), encoding="utf-8") as f:
        m = re.search(r'#define ATTN_VERSION_STRING "([^"]+)"', f.read())
    if not m:
        raise RuntimeError("attn.h has no ATTN_VERSION_STRING")
    return m.group(1)


class BuildPackage(build_py):
    """Lays out attn_h/ in the build directory and compiles the library into it."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "attn_h")
        os.makedirs(pkg, exist_ok=True)
        shutil.copyfile(os.path.join(ROOT, "python", "attn_h.py"), os.path.join(pkg, "__init__.py"))
        shutil.copyfile(os.path.join(ROOT, "attn.h"), os.path.join(pkg, "attn.h"))
        shutil.copyfile(os.path.join(ROOT, "LICENSE"), os.path.join(pkg, "LICENSE"))
        with open(os.path.join(pkg, "__main__.py"), "w", encoding="utf-8") as f:
            f.write("from attn_h import main\n\nraise SystemExit(main())\n")
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not cc:
            raise RuntimeError("attn_h: no C compiler found (set CC, or install gcc or clang)")
        # No -march: the library must run on any machine of this architecture (a wheel moves).
        # On x86-64 the header compiles its AVX-512, AVX2 and plain-C loops side by side and
        # each context runs the widest its CPU has (attn.h, CPU INNER LOOPS).
        cmd = [cc, "-std=c99", "-O2", "-fPIC", "-shared", "-I", ROOT,
               os.path.join(ROOT, "python", "attn_shared.c"), "-o", os.path.join(pkg, "libattn.so"),
               "-lpthread", "-lm", "-ldl"]
        print("attn_h: " + " ".join(cmd))
        subprocess.check_call(cmd)


class NativeDistribution(Distribution):
    """A wheel with a native library is not pure Python."""

    def has_ext_modules(self):
        return True

    def has_pure_modules(self):  # build_py lays out the package (setup() lists no sources)
        return True


cmdclass = {"build_py": BuildPackage}
try:
    from wheel.bdist_wheel import bdist_wheel

    class BdistWheel(bdist_wheel):
        """py3-none-<platform>: any Python 3, this platform."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel
except ImportError:  # no wheel package: pip's build environment installs it (pyproject.toml)
    pass

setup(
    name="attn_h",
    version=header_version(),
    description="attn.h from Python: paged attention and MLA on CPU and NVIDIA GPUs (ctypes, no extension)",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    classifiers=["License :: OSI Approved :: MIT License"],
    python_requires=">=3.8",
    install_requires=["numpy"],
    packages=[],
    cmdclass=cmdclass,
    distclass=NativeDistribution,
    zip_safe=False,
)
