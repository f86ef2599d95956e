# SPDX-License-Identifier: Apache-2.0
"""The check-and-report helpers of the Python tests in test/replay (standard library only)."""

failures = []


def check(condition, what, detail=""):
    """Prints `ok` or `FAIL` with `what` (and `detail` under a failure) and remembers failures."""
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        failures.append(what)
        if detail:
            print("      " + detail.replace("\n", "\n      "))


def finish():
    """The exit status: 1 when a check failed, after saying how many."""
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0
