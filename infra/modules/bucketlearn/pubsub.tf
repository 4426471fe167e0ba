# Tasks: one message per task of a round, published by the split function (round 0), the
# aggregator (each next round) and the watchdog (lost tasks), pulled by the learners.
# Results: one small "result ready" message per result object a learner writes to the deltas
# bucket, plus the watchdog's nudges, pulled by the aggregator pool.
# Each subscription has its own dead-letter topic and sink subscription (with dead_letter_enabled):
# the tasks' sink is drained by the controller, the results' is kept for an operator.
#
# Encryption: Google-managed keys. The messages carry ids and object names, never training data
# (that stays in the buckets), so CMEK is not required; add kms_key_name if your policy says so.

resource "google_pubsub_topic" "tasks" {
  #checkov:skip=CKV_GCP_83:Messages hold only ids and object names (no training data); Google-managed encryption is sufficient.
  name    = local.tasks_topic_name
  project = var.project_id
  labels  = local.labels

  depends_on = [google_project_service.apis]
}

# Where Pub/Sub moves a task after max_delivery_attempts deliveries (a message that crashes the
# worker before the app can record the attempt). The app itself gives up after max_task_attempts.
resource "google_pubsub_topic" "dead_letter" {
  #checkov:skip=CKV_GCP_83:Messages hold only ids and object names (no training data); Google-managed encryption is sufficient.
  name    = "${var.name_prefix}-tasks-dead-letter"
  project = var.project_id
  labels  = local.labels

  depends_on = [google_project_service.apis]
}

resource "google_pubsub_subscription" "tasks" {
  name    = local.tasks_subscription_name
  project = var.project_id
  topic   = google_pubsub_topic.tasks.id
  labels  = local.labels

  # The worker's streaming pull extends leases while a task trains; 60 s bounds how long a
  # killed worker's task waits before someone else gets it (invariant 4).
  ack_deadline_seconds         = var.ack_deadline_seconds
  message_retention_duration   = var.message_retention_duration
  retain_acked_messages        = false
  enable_exactly_once_delivery = var.enable_exactly_once_delivery
  enable_message_ordering      = false

  # Never delete the subscription for inactivity (the default is 31 days without pulls, which a
  # quiet project reaches easily).
  expiration_policy {
    ttl = ""
  }

  retry_policy {
    minimum_backoff = var.retry_minimum_backoff
    maximum_backoff = var.retry_maximum_backoff
  }

  dynamic "dead_letter_policy" {
    for_each = var.dead_letter_enabled ? [var.max_delivery_attempts] : []
    content {
      dead_letter_topic     = google_pubsub_topic.dead_letter.id
      max_delivery_attempts = dead_letter_policy.value
    }
  }

  lifecycle {
    precondition {
      condition     = var.max_task_attempts < var.max_delivery_attempts
      error_message = "max_task_attempts must be below max_delivery_attempts: the app must record a failed task before Pub/Sub dead-letters it."
    }
  }
}

# Keeps dead-lettered messages (a topic without a subscription drops them) until the controller
# job (`bucketlearn autoscale`, every minute) drains them into failure markers; it is the sink's
# only consumer (iam.tf: subscriber for the autoscaler account alone; no push config). Retention
# is the maximum, 7 days, whatever the tasks subscription keeps: enough to ride out a paused
# scheduler or a broken controller image. Acked messages are retained as long, so a drained
# message can still be replayed: `gcloud pubsub subscriptions seek <name> --time=...`.
resource "google_pubsub_subscription" "dead_letter_sink" {
  name    = "${var.name_prefix}-tasks-dead-letter-sink"
  project = var.project_id
  topic   = google_pubsub_topic.dead_letter.id
  labels  = local.labels

  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"
  retain_acked_messages      = true

  expiration_policy {
    ttl = ""
  }
}

# "Result ready" messages: a learner publishes one after writing its result object to the deltas
# bucket, and the controller's watchdog publishes nudges for stalled jobs. The aggregator pool
# pulls them with streaming pull (tens of milliseconds, where an Eventarc storage trigger per
# result costs 1-3 s plus cold starts) and acks one only once it is folded (or found to be
# nothing to fold). Losing a message delays a round and loses nothing: the results themselves
# are objects in the deltas bucket, which the watchdog lists as its backstop.
resource "google_pubsub_topic" "results" {
  #checkov:skip=CKV_GCP_83:Messages hold only ids and object names (no training data); Google-managed encryption is sufficient.
  name    = local.results_topic_name
  project = var.project_id
  labels  = local.labels

  depends_on = [google_project_service.apis]
}

# Results the aggregator cannot take are acked by it (and logged); the dead-letter policy is the
# backstop for a message that crashes the aggregator itself, which would otherwise come back for
# the whole retention. A dead-lettered result message delays a round and loses nothing: the
# result is an object in the deltas bucket, which the aggregator and the watchdog list as their
# backstop (the watchdog nudges the job after stall_seconds). max_delivery_attempts is Pub/Sub's
# maximum, 100, not var.max_delivery_attempts: a message for a job another aggregator holds is
# handed back for a few seconds and redelivered, and each of those counts as a delivery.
# Retention and expiration as for the tasks. Pub/Sub's exactly-once is not needed: the
# aggregator ignores a task it already applied (invariant 2).
resource "google_pubsub_subscription" "results" {
  name    = local.results_subscription_name
  project = var.project_id
  topic   = google_pubsub_topic.results.id
  labels  = local.labels

  ack_deadline_seconds         = var.ack_deadline_seconds
  message_retention_duration   = var.message_retention_duration
  retain_acked_messages        = false
  enable_exactly_once_delivery = false
  enable_message_ordering      = false

  expiration_policy {
    ttl = ""
  }

  # Only a nacked or expired message waits (an aggregator that died mid-fold, a job another
  # aggregator holds); the normal path is one delivery, acked after the fold.
  retry_policy {
    minimum_backoff = var.retry_minimum_backoff
    maximum_backoff = var.retry_maximum_backoff
  }

  dynamic "dead_letter_policy" {
    for_each = var.dead_letter_enabled ? [local.results_max_delivery_attempts] : []
    content {
      dead_letter_topic     = google_pubsub_topic.results_dead_letter.id
      max_delivery_attempts = dead_letter_policy.value
    }
  }
}

# Where Pub/Sub moves a result message after results_max_delivery_attempts deliveries.
resource "google_pubsub_topic" "results_dead_letter" {
  #checkov:skip=CKV_GCP_83:Messages hold only ids and object names (no training data); Google-managed encryption is sufficient.
  name    = "${var.name_prefix}-results-dead-letter"
  project = var.project_id
  labels  = local.labels

  depends_on = [google_project_service.apis]
}

# Keeps dead-lettered result messages for an operator to inspect (the alert below says one
# arrived); no component consumes it, since the result itself waits in the deltas bucket.
# `gcloud pubsub subscriptions pull <name> --limit=10` shows them; retention is the maximum, 7
# days, and acked messages are kept as long (`gcloud pubsub subscriptions seek` to see them again).
resource "google_pubsub_subscription" "results_dead_letter_sink" {
  name    = "${var.name_prefix}-results-dead-letter-sink"
  project = var.project_id
  topic   = google_pubsub_topic.results_dead_letter.id
  labels  = local.labels

  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"
  retain_acked_messages      = true

  expiration_policy {
    ttl = ""
  }
}

# A task dead-lettered means it crashed its worker max_delivery_attempts times. The controller
# drains the sink within a minute, faster than num_undelivered_messages is sampled, so the alert
# counts what Pub/Sub forwards from the tasks subscription instead; a second condition fires when
# dead letters wait in the sink for 10 minutes (the controller is paused or failing).
resource "google_monitoring_alert_policy" "dead_letters" {
  project               = var.project_id
  display_name          = "${var.name_prefix}: tasks dead-lettered"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "messages dead-lettered from ${google_pubsub_subscription.tasks.name}"
    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND resource.labels.subscription_id = \"${google_pubsub_subscription.tasks.name}\" AND metric.type = \"pubsub.googleapis.com/subscription/dead_letter_message_count\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_DELTA"
      }
    }
  }

  conditions {
    display_name = "dead letters not drained from ${google_pubsub_subscription.dead_letter_sink.name}"
    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND resource.labels.subscription_id = \"${google_pubsub_subscription.dead_letter_sink.name}\" AND metric.type = \"pubsub.googleapis.com/subscription/oldest_unacked_message_age\""
      comparison      = "COMPARISON_GT"
      threshold_value = 600
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A bucketlearn task was delivered ${var.max_delivery_attempts} times without being acknowledged. The controller job (`${google_cloud_run_v2_job.autoscaler.name}`) drains `${google_pubsub_subscription.dead_letter_sink.name}` every minute into a failure marker for the task (the job's max_failed_tasks decides whether it goes on); check the worker logs for the task id. Acked dead letters are kept 7 days: seek the subscription to a time to see them again. If the second condition fired, the controller is not draining: check the scheduler job and the controller's logs."
  }

  depends_on = [google_project_service.apis]
}

# A result message dead-lettered means it was delivered results_max_delivery_attempts times
# without an ack: it crashed the aggregator, or the aggregator kept failing on it. Nothing is
# lost (the result is in the deltas bucket), but the aggregator has a bug to look at.
resource "google_monitoring_alert_policy" "results_dead_letters" {
  project               = var.project_id
  display_name          = "${var.name_prefix}: results dead-lettered"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "messages dead-lettered from ${google_pubsub_subscription.results.name}"
    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND resource.labels.subscription_id = \"${google_pubsub_subscription.results.name}\" AND metric.type = \"pubsub.googleapis.com/subscription/dead_letter_message_count\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_DELTA"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A bucketlearn result message was delivered ${local.results_max_delivery_attempts} times to the aggregator pool (`${google_cloud_run_v2_worker_pool.aggregator.name}`) without being acknowledged: it crashed the aggregator, or the aggregator kept failing on it. Nothing is lost: the result is an object in the deltas bucket, which the aggregator lists, and the watchdog nudges the job after stall_seconds. Pull the message from `${google_pubsub_subscription.results_dead_letter_sink.name}` (kept 7 days, acked ones too) and check the aggregator's logs for its job id."
  }

  depends_on = [google_project_service.apis]
}
