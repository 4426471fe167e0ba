"""Cloud Function entry point (2nd gen, CloudEvent): thin, the core decides.

``on_upload`` is triggered by objects finalized in the uploads bucket. A normal return acks the
event (accepted, duplicate, rejected, failed, ignored); an exception makes Eventarc retry it
(transient trouble, or a crash mid-way). Task results do not come through a function: learners
announce them on the results topic, which the long-running aggregator pulls
(``bucketlearn aggregator``).

The handler is built on the process's Services (``bootstrap.process_services``, the default of
``upload_handler``: Google Cloud, or the emulators the environment names), made on the first
event.
"""

from __future__ import annotations

import functions_framework

from bucketlearn.entrypoints import functions as entrypoints

on_upload = functions_framework.cloud_event(entrypoints.upload_handler())
