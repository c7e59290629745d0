"""All SQL lives in ``shellbox.store``: no other module imports SQLAlchemy (or a database
driver) or runs a statement. Read from the source with ``ast``, so comments and strings
that mention them do not count, and an aliased import does."""

from __future__ import annotations

import ast
from pathlib import Path

import shellbox

PACKAGE = Path(shellbox.__file__).parent
STORE = PACKAGE / "store"
DATABASE_MODULES = ("sqlalchemy", "alembic", "sqlite3", "psycopg", "psycopg2")
STATEMENT_CALLS = ("execute", "executemany", "exec_driver_sql", "executescript")


def violations(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in DATABASE_MODULES:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {name}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in STATEMENT_CALLS
        ):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} calls .{node.func.attr}(")
    return found


def test_no_sql_outside_the_store() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if STORE not in p.parents]
    assert len(modules) > 50  # the whole package was looked at
    found = [v for p in sorted(modules) for v in violations(p)]
    assert found == []


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import sqlalchemy as sa\n"
        "from sqlalchemy.orm import Session\n"
        "# conn.execute(x) in a comment does not count\n"
        "text = 'conn.execute(x)'\n"
        "def f(conn):\n"
        "    return conn.execute(sa.select(1))\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        assert violations(sample) == [
            "sample.py:1 imports sqlalchemy",
            "sample.py:2 imports sqlalchemy.orm",
            "sample.py:6 calls .execute(",
        ]
    finally:
        PACKAGE = saved
