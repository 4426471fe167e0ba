"""What the local stack's storage emulator (fake-gcs-server) does as Cloud Storage does, checked
on it: generations, preconditions and the Pub/Sub notification the storage trigger is built on.

The pipeline's correctness does not rest on preconditions (atomicity lives in Firestore), but a
test that relies on an emulator behaving like Cloud Storage says so here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from bucketlearn.local.notifications import STORAGE_EVENTS_TOPIC, subscriber_client

pytestmark = pytest.mark.integration
TIMEOUT = 30.0


def test_generations_and_preconditions_are_honoured(cloud: Any) -> None:
    """A replaced generation is gone (404, the bucket keeps no versions); an upload with a stale
    ``if_generation_match`` (or 0, "must not exist") is refused with 412; ensure_bucket twice is
    fine."""
    # Prepare
    cloud.store.ensure_bucket(cloud.settings.work_bucket)
    bucket = cloud.store.client.bucket(cloud.settings.work_bucket)
    name = f"gen-{uuid.uuid4().hex[:8]}"
    first = cloud.store.write_bytes(bucket.name, name, b"first", "text/plain")
    second = cloud.store.write_bytes(bucket.name, name, b"second", "text/plain")
    # Execute / Assert
    with pytest.raises(gexc.NotFound):
        bucket.blob(name, generation=first.generation).download_as_bytes(timeout=TIMEOUT)
    assert bucket.blob(name, generation=second.generation).download_as_bytes(
        timeout=TIMEOUT) == b"second"
    for stale in (first.generation, 0):
        with pytest.raises(gexc.PreconditionFailed):
            bucket.blob(name).upload_from_string(b"lost", if_generation_match=stale,
                                                 timeout=TIMEOUT)
    bucket.blob(name).upload_from_string(b"third", if_generation_match=second.generation,
                                         timeout=TIMEOUT)
    assert cloud.store.read_bytes(bucket.name, name) == b"third"


def pull_for(subscriber: Any, path: str, bucket: str, count: int) -> list[Any]:
    """The first ``count`` notifications of ``bucket`` (acknowledging everything pulled)."""
    found: list[Any] = []
    deadline = time.monotonic() + TIMEOUT
    while len(found) < count and time.monotonic() < deadline:
        response = subscriber.pull(request={"subscription": path, "max_messages": 100},
                                   timeout=10)
        found += [m.message for m in response.received_messages
                  if m.message.attributes.get("bucketId") == bucket]
        if response.received_messages:
            subscriber.acknowledge(request={"subscription": path, "ack_ids": [
                m.ack_id for m in response.received_messages]}, timeout=TIMEOUT)
    return found


def test_a_finalize_publishes_cloud_storages_json_api_v1_notification(cloud: Any) -> None:
    """Attributes eventType, payloadFormat, bucketId, objectId, objectGeneration (and
    overwroteGeneration on an overwrite); data: the object resource as JSON, with its metadata."""
    # Prepare
    settings = cloud.settings
    subscriber = subscriber_client(settings.pubsub_emulator_host)
    path = subscriber.subscription_path(settings.project, f"t-{uuid.uuid4().hex[:8]}")
    subscriber.create_subscription(request={
        "name": path, "topic": subscriber.topic_path(settings.project, STORAGE_EVENTS_TOPIC)},
        timeout=TIMEOUT)
    bucket, name = settings.uploads_bucket, f"ü {uuid.uuid4().hex[:6]}.csv"
    try:
        # Execute
        first = cloud.store.write_bytes(bucket, name, b"a,b\n", "text/csv", {"epochs": "2"})
        second = cloud.store.write_bytes(bucket, name, b"a,b\n1,2\n", "text/csv")
        messages = pull_for(subscriber, path, bucket, 2)
    finally:
        subscriber.delete_subscription(request={"subscription": path}, timeout=TIMEOUT)
        subscriber.close()
    # Assert
    by_generation = {int(m.attributes["objectGeneration"]): m for m in messages}
    assert set(by_generation) == {first.generation, second.generation}
    for info in (first, second):
        message = by_generation[info.generation]
        attributes = dict(message.attributes)
        assert attributes["eventType"] == "OBJECT_FINALIZE"
        assert attributes["payloadFormat"] == "JSON_API_V1"
        assert (attributes["bucketId"], attributes["objectId"]) == (bucket, name)
        assert attributes["eventTime"].endswith("Z")
        data = json.loads(message.data)
        assert data["kind"] == "storage#object"
        assert (data["bucket"], data["name"], data["generation"], data["size"]) == (
            bucket, name, str(info.generation), str(info.size))
        assert data["contentType"] == "text/csv"
        assert data.get("metadata", {}) == info.metadata
        assert {"md5Hash", "crc32c", "timeCreated", "updated"} <= set(data)
    assert "overwroteGeneration" not in by_generation[first.generation].attributes
    assert by_generation[second.generation].attributes["overwroteGeneration"] == str(
        first.generation)


def test_an_emulator_for_one_uploads_bucket_notifies_for_that_bucket_alone(
        cloud: Any, tmp_path: Any) -> None:
    """``Emulators(uploads_bucket=...)``'s storage emulator, as a deployment's trigger: objects
    of the uploads bucket publish a notification, the work bucket's publish none."""
    from bucketlearn.adapters.gcs import GcsBlobStore
    from bucketlearn.local.emulators import Proc, free_port, storage_emulator_argv, wait_http
    from bucketlearn.local.notifications import ensure_topic

    # Prepare: a storage emulator of its own on the shared Pub/Sub emulator, its own topic
    settings = cloud.settings
    topic = f"one-bucket-{uuid.uuid4().hex[:8]}"
    ensure_topic(settings.pubsub_emulator_host, settings.project, topic)
    subscriber = subscriber_client(settings.pubsub_emulator_host)
    path = subscriber.subscription_path(settings.project, f"t-{uuid.uuid4().hex[:8]}")
    subscriber.create_subscription(request={
        "name": path, "topic": subscriber.topic_path(settings.project, topic)}, timeout=TIMEOUT)
    port = free_port()
    proc = Proc("storage", storage_emulator_argv(port, topic, settings.project,
                                                 events_bucket=settings.uploads_bucket),
                tmp_path / "storage.log",
                {**os.environ, "PUBSUB_EMULATOR_HOST": settings.pubsub_emulator_host},
                f"test-{uuid.uuid4().hex[:8]}")
    proc.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/storage/v1/b?project={settings.project}", TIMEOUT, proc)
        store = GcsBlobStore(dataclasses.replace(settings, storage_emulator_host=url))
        for bucket in (settings.uploads_bucket, settings.work_bucket):
            store.ensure_bucket(bucket)
        # Execute: three work objects, then one upload (notifications come in order here)
        for i in range(3):
            store.write_bytes(settings.work_bucket, f"part-{i}", b"x", "application/octet-stream")
        upload = store.write_bytes(settings.uploads_bucket, "one.csv", b"a,b\n", "text/csv")
        messages = every_notification(subscriber, path, settings.uploads_bucket)
    finally:
        proc.stop()
        subscriber.delete_subscription(request={"subscription": path}, timeout=TIMEOUT)
        subscriber.close()
    # Assert: the upload's notification, and nothing else published
    assert [(m.attributes["bucketId"], m.attributes["objectId"],
             int(m.attributes["objectGeneration"])) for m in messages] == [
        (settings.uploads_bucket, "one.csv", upload.generation)]


def every_notification(subscriber: Any, path: str, bucket: str, quiet: float = 1.0
                       ) -> list[Any]:
    """Every notification on ``path`` until one of ``bucket`` came and ``quiet`` seconds went by
    with no more (all acknowledged)."""
    found: list[Any] = []
    deadline = time.monotonic() + TIMEOUT
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        response = subscriber.pull(request={"subscription": path, "max_messages": 100},
                                   timeout=10)
        found += [m.message for m in response.received_messages]
        if response.received_messages:
            subscriber.acknowledge(request={"subscription": path, "ack_ids": [
                m.ack_id for m in response.received_messages]}, timeout=TIMEOUT)
            quiet_since = None
        elif any(m.attributes.get("bucketId") == bucket for m in found):
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet:
                break
        time.sleep(0.1)
    return found
