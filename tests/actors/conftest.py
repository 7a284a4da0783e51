"""Fixtures of the Ray end-to-end tests: groups that are always shut down."""

from __future__ import annotations

import pytest
from groupcheck import TEST_CONFIG
from rayledger.actors import LedgerGroup


@pytest.fixture
def make_group(ray_session, tmp_path, group_name):
    """Create groups for a test and always shut them down, even when the test fails."""
    groups = []

    def make(members=3, store=True, config=None, name=None):
        g = LedgerGroup.create(
            name or f"{group_name}-{len(groups)}",
            members,
            store_dir=str(tmp_path / "data") if store else None,
            config=config or TEST_CONFIG,
        )
        groups.append(g)
        return g

    yield make
    for g in groups:
        g.shutdown(delete_data=True)
