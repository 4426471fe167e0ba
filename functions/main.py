"""Cloud Function entry point (2nd gen, CloudEvent): thin, the core decides.

``on_upload`` is triggered by objects finalized in the uploads bucket. A normal return acks the
event (accepted, duplicate, rejected, failed, ignored); an exception makes Eventarc retry it
(transient trouble, or a crash mid-way). Task results do not come through a function: learners
announce them on the results topic, which the long-running aggregator pulls
(``bucketlearn aggregator``).
"""

from __future__ import annotations

import functions_framework
from cloudevents.http import CloudEvent

from bucketlearn.entrypoints import functions as entrypoints


@functions_framework.cloud_event
def on_upload(cloud_event: CloudEvent) -> None:
    entrypoints.on_upload(cloud_event)
