# Learner workers and the aggregator: two Cloud Run worker pools, from the same image.
#
# Why a worker pool and not a Cloud Run service with min instances:
#   * The learner, like the aggregator, is a long-running pull loop with no HTTP server. A
#     worker pool is the Cloud Run resource made for that: no endpoint, no request timeout, CPU
#     always allocated. A service would need a dummy listener on $PORT, `cpu_idle = false`, and
#     min instances pinned, and would still be scaled on request load it never receives.
#   * Backlog scaling needs an external controller either way (worker pools do not autoscale on
#     Pub/Sub backlog; services scale on requests/CPU). The worker pool's manual instance count
#     is made for external controllers: changing it does not create a revision.
#   Documented alternative, if worker pools are not available in your region/org: a
#   google_cloud_run_v2_service with template.scaling min = max = N, cpu_idle = false, ingress
#   internal, a tiny health listener in the worker, and the autoscaler updating
#   scaling.manual_instance_count of the service (Cloud Run services support manual scaling
#   too). The scaling policy in bucketlearn is the same; only the resource it resizes changes.
#
# The resource is in the GA `google` provider since 6.37.0 (and google-beta since the same
# release), so no google-beta provider is needed here; 6.47.0 is the first release that sends
# manual_instance_count = 0 (versions.tf). launch_stage BETA lets the API accept manual scaling
# while that is a preview feature.
#
# Shutdown: Cloud Run sends SIGTERM and kills 10 s later. The worker stops pulling and nacks; a
# task it could not finish is redelivered after its ack deadline (invariant 4), and the
# aggregator ignores a second delta of an applied task (invariant 2).

resource "google_cloud_run_v2_worker_pool" "learners" {
  name                = local.worker_pool_name
  project             = var.project_id
  location            = var.region
  description         = "bucketlearn learner workers (pull tasks, train, write deltas)"
  labels              = local.labels
  launch_stage        = var.worker_pool_launch_stage
  deletion_protection = var.deletion_protection

  # Manual scaling (the default mode). Terraform sets the starting count; from then on the
  # autoscaler owns it (see ignore_changes).
  scaling {
    manual_instance_count = var.min_workers
  }

  template {
    service_account = google_service_account.worker.email
    labels          = local.labels

    containers {
      name  = "learner"
      image = var.worker_image

      resources {
        limits = {
          cpu    = var.worker_cpu
          memory = var.worker_memory
        }
      }

      dynamic "env" {
        for_each = local.runtime_env
        content {
          name  = env.key
          value = env.value
        }
      }
    }
  }

  lifecycle {
    ignore_changes = [
      # Set by the autoscaler every minute; Terraform must not reset it on the next apply.
      scaling[0].manual_instance_count,
      launch_stage,
      client,
      client_version,
    ]

    precondition {
      condition     = var.min_workers <= var.max_workers
      error_message = "min_workers must not exceed max_workers."
    }

    precondition {
      condition     = local.worker_memory_mib >= local.memory_mib_range_by_cpu[var.worker_cpu][0] && local.worker_memory_mib <= local.memory_mib_range_by_cpu[var.worker_cpu][1]
      error_message = "worker_memory does not fit worker_cpu. Cloud Run allows: 1 vCPU 512Mi-4Gi, 2 vCPU 512Mi-8Gi, 4 vCPU 2Gi-16Gi, 6 vCPU 4Gi-24Gi, 8 vCPU 4Gi-32Gi."
    }
  }

  depends_on = [
    google_project_service.apis,
    google_storage_bucket_iam_member.worker,
    google_storage_bucket_iam_member.worker_prefixes,
    google_pubsub_subscription_iam_member.worker_subscriber,
    google_project_iam_member.firestore_users,
  ]
}

# --- aggregator --------------------------------------------------------------------------------
#
# The aggregator: a long-running `bucketlearn aggregator` process that pulls "result ready"
# messages (learners' results, the watchdog's nudges) from the results subscription with
# streaming pull, folds each round into the next version, commits it to Firestore, publishes
# the next round's tasks, evaluates and exports. It replaces the aggregate Cloud Function, whose
# Eventarc trigger on the deltas bucket cost 1-3 s per result (plus cold starts): longer than
# most rounds' training. One instance serves every job; a job is held by one aggregator at a
# time through a Firestore lease (the single writer of its versions), so a second instance only
# takes other jobs. The controller job sizes the pool: 1 while any job is active, 0 when idle,
# within [min_aggregators, max_aggregators].
#
# Shutdown (scale-in, a new revision): Cloud Run sends SIGTERM and kills 10 s later. A result
# message is acked only once folded, so one in flight is redelivered after its ack deadline; the
# lease of the killed holder expires and the next aggregator picks up every unapplied result
# from the deltas bucket (invariant 4), ignoring tasks already applied (invariant 2).

resource "google_cloud_run_v2_worker_pool" "aggregator" {
  name                = local.aggregator_pool_name
  project             = var.project_id
  location            = var.region
  description         = "bucketlearn aggregator (pull result messages, fold rounds into versions, publish the next round, export)"
  labels              = local.labels
  launch_stage        = var.worker_pool_launch_stage
  deletion_protection = var.deletion_protection

  # Manual scaling, as for the learners: Terraform sets the starting count, then the autoscaler
  # owns it (see ignore_changes).
  scaling {
    manual_instance_count = var.min_aggregators
  }

  template {
    service_account = google_service_account.aggregate.email
    labels          = local.labels

    containers {
      name    = "aggregator"
      image   = var.worker_image
      command = ["bucketlearn"]
      args    = ["aggregator"]

      resources {
        limits = {
          cpu    = var.aggregator_cpu
          memory = var.aggregator_memory
        }
      }

      dynamic "env" {
        for_each = local.runtime_env
        content {
          name  = env.key
          value = env.value
        }
      }
    }
  }

  lifecycle {
    ignore_changes = [
      # Set by the autoscaler every minute; Terraform must not reset it on the next apply.
      scaling[0].manual_instance_count,
      launch_stage,
      client,
      client_version,
    ]

    precondition {
      condition     = var.min_aggregators <= var.max_aggregators
      error_message = "min_aggregators must not exceed max_aggregators."
    }

    precondition {
      condition     = local.aggregator_memory_mib >= local.memory_mib_range_by_cpu[var.aggregator_cpu][0] && local.aggregator_memory_mib <= local.memory_mib_range_by_cpu[var.aggregator_cpu][1]
      error_message = "aggregator_memory does not fit aggregator_cpu. Cloud Run allows: 1 vCPU 512Mi-4Gi, 2 vCPU 512Mi-8Gi, 4 vCPU 2Gi-16Gi, 6 vCPU 4Gi-24Gi, 8 vCPU 4Gi-32Gi."
    }
  }

  depends_on = [
    google_project_service.apis,
    google_storage_bucket_iam_member.aggregate,
    google_pubsub_subscription_iam_member.aggregator_results_subscriber,
    google_pubsub_topic_iam_member.aggregator_results_publisher,
    google_pubsub_topic_iam_member.aggregate_publisher,
    google_project_iam_member.firestore_users,
  ]
}

# --- autoscaler (the controller) ---------------------------------------------------------------
#
# Every minute Cloud Scheduler starts a one-task Cloud Run job that runs `bucketlearn autoscale`
# (same image as the workers). The command first makes the watchdog's pass
# (bucketlearn/loops/watchdog.py): it drains the dead-letter sink (BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION,
# with dead_letter_enabled) into failure markers in the deltas bucket; then, for every active job
# that showed no progress for BUCKETLEARN_STALL_SECONDS, it publishes the round's missing tasks
# again (reading the job's manifest in the work bucket), or publishes a nudge message for the
# job to the results topic (BUCKETLEARN_RESULTS_TOPIC), which wakes the aggregator like a
# learner's "result ready" message does; the aggregator then lists the job's results in the
# deltas bucket, the backstop for a lost message. Then it sizes both pools through the Cloud Run
# Admin API, setting manual_instance_count only where the answer differs:
#   * the learners (BUCKETLEARN_WORKER_POOL): it counts the outstanding tasks (active jobs'
#     current epochs, neither applied nor failed) in Firestore - exact, no metric delay,
#     in-flight tasks included - and applies bucketlearn's scaling policy (desired workers from
#     outstanding tasks, clamped to [BUCKETLEARN_MIN_WORKERS, BUCKETLEARN_MAX_WORKERS],
#     scale-down cool-down), the same policy the local supervisor uses;
#   * the aggregator (BUCKETLEARN_AGGREGATOR_POOL): 1 while any job is active, 0 when none is,
#     clamped to [BUCKETLEARN_MIN_AGGREGATORS, BUCKETLEARN_MAX_AGGREGATORS].
# It exits; nothing runs between ticks.
# A run that fails or overlaps the next one is harmless: each run only sets absolute counts,
# and every watchdog action is idempotent (a task published twice is applied once, a nudge for
# a job that moved on folds nothing, a dead letter is acked only after its marker is written).
# Its grants are in iam.tf.

resource "google_cloud_run_v2_job" "autoscaler" {
  name                = "${var.name_prefix}-autoscaler"
  project             = var.project_id
  location            = var.region
  labels              = local.labels
  deletion_protection = var.deletion_protection

  template {
    task_count  = 1
    parallelism = 1
    labels      = local.labels

    template {
      service_account = google_service_account.autoscaler.email
      max_retries     = 0
      # Shorter than the schedule's period so runs do not pile up.
      timeout = "50s"

      containers {
        name    = "autoscaler"
        image   = var.worker_image
        command = ["bucketlearn"]
        args    = ["autoscale"]

        resources {
          limits = {
            cpu    = "1"
            memory = "1Gi"
          }
        }

        dynamic "env" {
          for_each = merge(local.runtime_env, local.autoscaler_env)
          content {
            name  = env.key
            value = env.value
          }
        }
      }
    }
  }

  lifecycle {
    ignore_changes = [launch_stage, client, client_version]

    precondition {
      condition     = var.stall_seconds > var.ack_deadline_seconds
      error_message = "stall_seconds must exceed ack_deadline_seconds: Pub/Sub redelivers the task of a worker that died after its ack deadline; the watchdog is for tasks lost for good."
    }
  }

  depends_on = [
    google_project_service.apis,
    google_cloud_run_v2_worker_pool_iam_member.autoscaler_developer,
    google_cloud_run_v2_worker_pool_iam_member.autoscaler_aggregator_developer,
    google_project_iam_member.firestore_users,
    google_storage_bucket_iam_member.autoscaler,
    google_pubsub_topic_iam_member.autoscaler_publisher,
    google_pubsub_topic_iam_member.autoscaler_results_publisher,
    google_pubsub_subscription_iam_member.autoscaler_dead_letter_subscriber,
    # its count of running batch predictions' parts is a collection-group query on this index
    google_firestore_field.predictions_state,
  ]
}

resource "google_cloud_scheduler_job" "autoscaler" {
  name             = "${var.name_prefix}-autoscaler"
  project          = var.project_id
  region           = coalesce(var.scheduler_region, var.region)
  description      = "Runs the bucketlearn autoscaler job (the watchdog: lost tasks republished, dead letters drained, stalled jobs nudged; then the learner pool resized from the task backlog and the aggregator pool from the active jobs)"
  schedule         = var.autoscaler_schedule
  time_zone        = "Etc/UTC"
  paused           = var.autoscaler_paused
  attempt_deadline = "30s"

  retry_config {
    # The next tick is a minute away; a retry would only overlap it.
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "https://run.googleapis.com/v2/projects/${var.project_id}/locations/${var.region}/jobs/${google_cloud_run_v2_job.autoscaler.name}:run"

    oauth_token {
      service_account_email = google_service_account.scheduler.email
      scope                 = "https://www.googleapis.com/auth/cloud-platform"
    }
  }

  depends_on = [
    google_project_service.apis,
    google_cloud_run_v2_job_iam_member.scheduler_invoker,
  ]
}
