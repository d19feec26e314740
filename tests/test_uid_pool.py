"""The host's pool of kernel uids (autograde/isolation/uids.py): one lock file per uid, held for a
kernel's life; a full pool makes the next kernel wait for a uid rather than fail at once."""
from __future__ import annotations

import threading
import time

import pytest

from autograde.isolation import uids


def test_a_free_uid_is_taken_from_the_preferred_one(tmp_path):
    first = uids.acquire(71000, 3, str(tmp_path), prefer=1, scrub_first=False)
    second = uids.acquire(71000, 3, str(tmp_path), prefer=1, scrub_first=False)
    try:
        assert (first.uid, second.uid) == (71001, 71002)
    finally:
        first.release()
        second.release()


def test_a_full_pool_waits_for_the_uid_to_come_back(tmp_path):
    held = uids.acquire(71000, 1, str(tmp_path), scrub_first=False)
    threading.Timer(0.5, held.release).start()
    started = time.monotonic()
    again = uids.acquire(71000, 1, str(tmp_path), scrub_first=False, wait_s=30)
    try:
        assert again.uid == 71000
        assert 0.3 < time.monotonic() - started < 30
    finally:
        again.release()


def test_a_pool_that_stays_full_is_named_after_the_wait(tmp_path):
    held = uids.acquire(71000, 1, str(tmp_path), scrub_first=False)
    try:
        with pytest.raises(RuntimeError, match=r"all 1 kernel uids from 71000 are in use .* "
                                               r"still after 0.3 s"):
            uids.acquire(71000, 1, str(tmp_path), scrub_first=False, wait_s=0.3)
    finally:
        held.release()
