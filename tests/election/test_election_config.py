"""ElectionConfig: DLedger's defaults and validation of impossible values."""

from __future__ import annotations

import pytest
from rayledger.election import ElectionConfig
from rayledger.storage.errors import InvalidRequestError, LedgerError, ResponseCode


def test_defaults_are_dledgers() -> None:
    cfg = ElectionConfig()
    assert cfg.heartbeat_interval_ms == 2000
    assert cfg.max_heartbeat_leak == 3
    assert (cfg.min_vote_interval_ms, cfg.max_vote_interval_ms) == (300, 1000)
    assert (cfg.min_take_leadership_vote_interval_ms, cfg.max_take_leadership_vote_interval_ms) == (
        30,
        100,
    )
    assert cfg.max_leadership_transfer_wait_index == 1000
    assert cfg.leadership_transfer_wait_timeout_ms == 1000
    assert cfg.preferred_leader_ids == ()
    assert cfg.enable_pre_vote is True
    assert cfg.vote_wait_base_ms == 2000
    assert cfg.heartbeat_timeout_ms == 6000


@pytest.mark.parametrize(
    ("given", "expected"),
    [("n1;n2", ("n1", "n2")), (["n1"], ("n1",)), (" n1 ; ", ("n1",)), (None, ())],
)
def test_preferred_leader_ids_are_normalised(given, expected) -> None:
    assert ElectionConfig(preferred_leader_ids=given).preferred_leader_ids == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"heartbeat_interval_ms": 0},
        {"heartbeat_interval_ms": -5},
        {"max_heartbeat_leak": 0},
        {"min_vote_interval_ms": -1},
        {"min_vote_interval_ms": 1000, "max_vote_interval_ms": 1000},
        {"min_vote_interval_ms": 800, "max_vote_interval_ms": 500},
        {"min_take_leadership_vote_interval_ms": 100, "max_take_leadership_vote_interval_ms": 30},
        {"max_leadership_transfer_wait_index": 0},
        {"leadership_transfer_wait_timeout_ms": 0},
        {"vote_wait_base_ms": -1},
        {"check_preferred_leader_interval_ms": 0},
        {"heartbeat_interval_ms": 2000.5},
        {"max_heartbeat_leak": True},
        {"enable_pre_vote": "yes"},
        {"preferred_leader_ids": ("n1", "n1")},
        {"preferred_leader_ids": ("n1", "")},
        {"preferred_leader_ids": 7},
    ],
)
def test_impossible_values_are_rejected_clearly(kwargs) -> None:
    with pytest.raises(LedgerError) as err:
        ElectionConfig(**kwargs)
    assert err.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    assert isinstance(err.value, InvalidRequestError)
    assert "ElectionConfig" in str(err.value)
