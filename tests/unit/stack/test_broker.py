"""The broker's pure parts: cluster ids the storage tool accepts."""

from __future__ import annotations

import base64

from dispatch.stack.broker import kafka_uuid


def test_cluster_ids_are_16_bytes_and_never_look_like_an_option() -> None:
    # One id in 64 would start with '-' by chance; a few thousand draws catch a regression.
    for _ in range(5000):
        cluster_id = kafka_uuid()
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
