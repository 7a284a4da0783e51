"""init_spark fails fast and clearly instead of hanging (no Spark is started here)."""

from __future__ import annotations

import pytest
from rayledger.integration.spark import reader as spark_mod

pytestmark = pytest.mark.ray


def test_missing_java_is_a_clear_error(ray_session, monkeypatch):
    if spark_mod.spark_running():
        pytest.skip("a Spark session is already running in this process")
    monkeypatch.setattr(spark_mod, "_find_java", lambda: None)
    with pytest.raises(spark_mod.SparkUnavailableError, match="Java"):
        spark_mod.init_spark("no-java")


def test_no_room_on_the_cluster_is_a_clear_error(ray_session):
    if spark_mod.spark_running():
        pytest.skip("a Spark session is already running in this process")
    with pytest.raises(spark_mod.SparkUnavailableError, match="free CPUs"):
        spark_mod.init_spark("too-big", num_executors=4, executor_cores=8)
    assert not spark_mod.spark_running()


def test_memory_sizes():
    assert spark_mod._memory_bytes("1GB") == 1 << 30
    assert spark_mod._memory_bytes("512m") == 512 << 20
    assert spark_mod._memory_bytes(1000) == 1000
