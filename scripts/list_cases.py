"""List every test case id with the assert statements its test function holds.

    .venv/bin/python scripts/list_cases.py [TESTS_DIR]

One line per case: ``id<TAB>asserts in the test function<TAB>asserts in the
module's helpers and fixtures``, then totals. Used to show that merging cases
into shared engine runs kept every case and every assertion (docs/testing.md).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def asserts_per_function(path: Path) -> dict[str, int]:
    """Asserts per top-level function (nested functions count in their parent)."""
    tree = ast.parse(path.read_text())
    return {
        node.name: sum(isinstance(n, ast.Assert) for n in ast.walk(node))
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def main() -> None:
    tests = Path(sys.argv[1] if len(sys.argv) > 1 else "tests")
    ids = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", str(tests)],
        capture_output=True,
        text=True,
        cwd=tests.parent,
    ).stdout.split("\n")
    ids = [i for i in ids if "::" in i]
    cases = total = 0
    helpers_seen: set[str] = set()
    helper_total = 0
    for case in ids:
        file, _, rest = case.partition("::")
        func = rest.split("[")[0]
        counts = asserts_per_function(tests.parent / file)
        own = counts.get(func, 0)
        helpers = sum(n for name, n in counts.items() if not name.startswith("test_"))
        if file not in helpers_seen:
            helpers_seen.add(file)
            helper_total += helpers
        print(f"{case}\t{own}\t{helpers}")
        cases += 1
        total += own
    print(
        f"TOTAL {cases} cases; {total} asserts in test functions (per case); "
        f"{helper_total} asserts in helpers and fixtures"
    )


if __name__ == "__main__":
    main()
