"""Prints each requirement of the named installed distributions that the environment does not
meet, and exits 1 if there is one (else prints "requirements met: ..."). For a machine that gets
wheels installed with pip --no-deps --target (the H200 machine reaches no registry): pip checks
nothing then, and a missing or too old dependency would show only as an import error later.

usage: PYTHONPATH=/tmp/site python3 tests/python/requirements_met.py transformers huggingface_hub ...
"""
import importlib.metadata as metadata
import sys

from packaging.requirements import Requirement


def unmet(names):
    """[(distribution, requirement, what is installed)] of every unmet requirement (extras not
    asked for are left out; markers are evaluated for this interpreter)."""
    bad = []
    for name in names:
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            bad.append((name, None, "not installed"))
            continue
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                bad.append((name, text, "not installed"))
                continue
            if not req.specifier.contains(have, prereleases=True):
                bad.append((name, text, have))
    return bad


def main(argv):
    if not argv:
        sys.exit(__doc__.strip().splitlines()[-1])
    bad = unmet(argv)
    for name, req, have in bad:
        print("%s: not installed" % name if req is None else "%s needs %s: %s" % (name, req, have))
    if not bad:
        print("requirements met: %s" % ", ".join("%s %s" % (n, metadata.version(n)) for n in argv))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
