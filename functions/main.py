"""Cloud Function entry points (2nd gen, CloudEvent): thin, the core decides.

``on_upload`` is triggered by objects finalized in the uploads bucket; ``on_delta`` by objects
finalized in the deltas bucket. A normal return acks the event (accepted, duplicate, rejected,
failed, ignored); an exception makes Eventarc retry it (transient trouble, or a crash mid-way).
"""

from __future__ import annotations

import functions_framework
from cloudevents.http import CloudEvent

from bucketlearn.entrypoints import functions as entrypoints


@functions_framework.cloud_event
def on_upload(cloud_event: CloudEvent) -> None:
    entrypoints.on_upload(cloud_event)


@functions_framework.cloud_event
def on_delta(cloud_event: CloudEvent) -> None:
    entrypoints.on_delta(cloud_event)
