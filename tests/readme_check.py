#!/usr/bin/env python3
"""Runs every snippet of README.md as written, so the README cannot drift from the library.

  ```c       compiled as a program (C99, -Wall -Wextra -Wpedantic -Werror, and with clang as
             C11 where clang is installed) against this repository's attn.h, then run from a
             scratch directory: exit status 0 required.
  ```python  run with python/ on PYTHONPATH (after `make build/libattn.so`) from the
             repository root: exit status 0 required (skipped, saying so, without numpy).
  ```sh      each command must be `make TARGET` of a target the Makefile has (`make -n`
             proves it); `make test` runs those targets itself.
  ```        (no language) plain text: not run.

Prints one line per snippet and ends with "N passed, N failed, N skipped"; exit 1 on a
failure. Usage: tests/readme_check.py [README.md]"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snippets(text):
    """(language, first line number, code) of every fenced block."""
    out, lang, start, body = [], None, 0, []
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^```(\w*)\s*$", line)
        if m and lang is None:
            lang, start, body = m.group(1), n + 1, []
        elif line.startswith("```") and lang is not None:
            out.append((lang, start, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    if lang is not None:
        raise SystemExit("readme_check: an unterminated ``` block starts at line %d" % (start - 1))
    return out


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, **kw)
    return p.returncode, p.stdout


def check_c(code, line, tmp):
    src = os.path.join(tmp, "snippet_%d.c" % line)
    with open(src, "w") as f:
        f.write(code)
    compilers = [("cc", "-std=c99")] + ([("clang", "-std=c11")] if shutil.which("clang") else [])
    for cc, std in compilers:
        exe = os.path.join(tmp, "snippet_%d_%s" % (line, cc))
        rc, log = run([cc, std, "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-O1", "-I", ROOT, src, "-o", exe,
                       "-lpthread", "-lm", "-ldl"])
        if rc:
            return "does not compile with %s %s:\n%s" % (cc, std, log)
        rc, log = run([exe], cwd=tmp)
        if rc:
            return "built with %s exits %d:\n%s" % (cc, rc, log)
    return None


def check_python(code, line, tmp):
    src = os.path.join(tmp, "snippet_%d.py" % line)
    with open(src, "w") as f:
        f.write(code)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    rc, log = run([sys.executable, src], cwd=ROOT, env=env)
    return "exits %d:\n%s" % (rc, log) if rc else None


def check_sh(code, line, tmp):
    for cmd in code.split("\n"):
        cmd = cmd.split("#", 1)[0].strip()
        if not cmd:
            continue
        m = re.match(r"^make(?: ([\w./-]+))?$", cmd)
        if not m:
            return "'%s' is not a `make TARGET` command (the only kind this check can prove)" % cmd
        rc, log = run(["make", "-n"] + ([m.group(1)] if m.group(1) else []), cwd=ROOT)
        if rc:
            return "'%s': the Makefile has no such target:\n%s" % (cmd, log)
    return None


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as f:
        blocks = snippets(f.read())
    try:
        import numpy  # noqa: F401
        numpy_ok = True
    except ImportError:
        numpy_ok = False
    passed = failed = skipped = 0
    tmp = tempfile.mkdtemp(prefix="readme-")
    try:
        for lang, line, code in blocks:
            name = "%s block at line %d" % (lang or "text", line)
            if lang == "c":
                why = check_c(code, line, tmp)
            elif lang == "python":
                if not numpy_ok:
                    print("SKIP %s: numpy not installed" % name)
                    skipped += 1
                    continue
                why = check_python(code, line, tmp)
            elif lang == "sh":
                why = check_sh(code, line, tmp)
            elif lang == "":
                continue
            else:
                why = "language '%s' has no check (allowed: c, python, sh, or none for plain text)" % lang
            if why:
                print("FAIL %s: %s" % (name, why))
                failed += 1
            else:
                print("ok   %s" % name)
                passed += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
