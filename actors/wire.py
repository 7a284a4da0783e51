"""How an entry batch's bytes cross Ray between actors.

A batch's ``data`` travels as a numpy array: Ray moves it out of band (one copy into the
object store, none through pickle) and the receiver maps it zero-copy.  As ``bytes`` it is
pickled in-band first -- for a 4 MiB catch-up push, 7 ms of the sender's CPU instead of 3.5
and a round trip of 9.5 ms instead of 4.5 (measured on a 2-core machine).  The receiving
member takes it back as a memoryview, which the store accepts like bytes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from rayledger.storage import EntryBatch

OUT_OF_BAND_BYTES = 64 * 1024  # smaller batches ride inside the call as bytes


def out_of_band(batch: EntryBatch) -> EntryBatch:
    """``batch`` as it should cross Ray (large data as a numpy array)."""
    data = batch.data
    if isinstance(data, bytes | bytearray) and len(data) > OUT_OF_BAND_BYTES:
        return replace(batch, data=np.frombuffer(data, dtype=np.uint8))
    return batch


def as_received(batch: Any) -> Any:
    """A batch as it arrived (a numpy array's data back as a memoryview of it); anything
    else as it is (a snapshot chunk's bytes arrive the same way)."""
    if isinstance(getattr(batch, "data", None), np.ndarray):
        return replace(batch, data=memoryview(batch.data))
    return batch
