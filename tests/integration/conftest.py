"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def spark(ray_session, request):
    """One Spark (through RayDP) per test module: it takes about 12 s to start."""
    from rayledger.integration.spark import init_spark, stop_spark

    session = init_spark(f"rayledger-{request.module.__name__.rsplit('.', 1)[-1]}")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_spark()
