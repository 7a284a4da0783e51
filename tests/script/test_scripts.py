"""Each file in testdata/ is a protocol scenario: commands and the exact trace they print
(see interaction.py).  ``pytest tests/script --rewrite`` writes the traces the code gives;
read the diff before committing it."""

from __future__ import annotations

from pathlib import Path

import pytest
from interaction import run_script

DATA = Path(__file__).parent / "testdata"


@pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda p: p.stem)
def test_script(path: Path, request) -> None:
    written, actual = run_script(path.read_text())
    if request.config.getoption("--rewrite"):
        path.write_text(actual)
        return
    assert actual == written, f"{path.name}: the trace changed (pytest --rewrite, then diff)"
