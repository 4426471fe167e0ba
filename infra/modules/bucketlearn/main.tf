# bucketlearn on Google Cloud. The resources are split by concern:
#   storage.tf    buckets (uploads, work, deltas, models, function sources)
#   pubsub.tf     tasks and results topics with their pull subscriptions, a dead-letter topic and
#                 sink subscription for each
#   firestore.tf  database, security rules and the TTL of worker heartbeats
#   functions.tf  split (on_upload) Cloud Function with its Eventarc trigger on the uploads bucket
#   workers.tf    learner and aggregator worker pools, autoscaler job, Cloud Scheduler trigger
#   dashboard.tf  Streamlit dashboard on Cloud Run behind IAP (or internal ingress)
#   iam.tf        one service account per component and every grant, scoped to one resource
#                 wherever the service allows it

data "google_project" "this" {
  project_id = var.project_id
}

locals {
  project_number = data.google_project.this.number

  labels = merge(var.labels, { app = "bucketlearn" })

  bucket_prefix = "${var.project_id}-${var.name_prefix}"

  tasks_topic_name        = "${var.name_prefix}-tasks"
  tasks_subscription_name = "${var.name_prefix}-tasks-workers"

  results_topic_name        = "${var.name_prefix}-results"
  results_subscription_name = "${var.name_prefix}-results-aggregator"
  # Pub/Sub's maximum: a result message is handed back and redelivered while another aggregator
  # holds its job, and each of those deliveries counts (pubsub.tf).
  results_max_delivery_attempts = 100

  # This environment's Firestore database: the one named, else one per name_prefix, so two
  # environments in a project never share collections. "<name_prefix>-db" always fits
  # Firestore's database ids (^[a-z][a-z0-9-]{2,61}[a-z0-9]$) for a name_prefix that passes its
  # validation.
  firestore_database = coalesce(var.firestore_database, "${var.name_prefix}-db")

  # The settings every component reads (bucketlearn.config.SETTINGS_ENV plus the project). The
  # split function, both worker pools, the autoscaler job and the dashboard all get exactly this
  # map (plus var.extra_env), and the env_vars output returns it, so the local stack,
  # `bucketlearn` on a laptop and the cloud read the same names. tests/infra checks the names
  # against bucketlearn.config.
  app_env = {
    GOOGLE_CLOUD_PROJECT             = var.project_id
    BUCKETLEARN_PROJECT              = var.project_id
    BUCKETLEARN_UPLOADS_BUCKET       = google_storage_bucket.uploads.name
    BUCKETLEARN_WORK_BUCKET          = google_storage_bucket.work.name
    BUCKETLEARN_DELTAS_BUCKET        = google_storage_bucket.deltas.name
    BUCKETLEARN_MODELS_BUCKET        = google_storage_bucket.models.name
    BUCKETLEARN_TASKS_TOPIC          = google_pubsub_topic.tasks.name
    BUCKETLEARN_TASKS_SUBSCRIPTION   = google_pubsub_subscription.tasks.name
    BUCKETLEARN_RESULTS_TOPIC        = google_pubsub_topic.results.name
    BUCKETLEARN_RESULTS_SUBSCRIPTION = google_pubsub_subscription.results.name
    BUCKETLEARN_FIRESTORE_DATABASE   = local.firestore_database
    BUCKETLEARN_ACK_DEADLINE_SECONDS = tostring(var.ack_deadline_seconds)
    BUCKETLEARN_MAX_TASK_ATTEMPTS    = tostring(var.max_task_attempts)
    BUCKETLEARN_LOG_FORMAT           = "json"
    # numpy's OpenBLAS on one thread (bucketlearn.config.ONE_THREAD_BLAS): its idle threads
    # spin after each call, about a core of the aggregator on a chained job
    OPENBLAS_NUM_THREADS = "1"
    # the split refuses a job predicted to train longer than half of it (issue #26, item 2)
    BUCKETLEARN_WORK_RETENTION_DAYS = tostring(var.work_retention_days)
    # How long one aggregation pass may go on starting folds (420 s with the default 540 s
    # function_timeout_seconds). It was a margin under the aggregate function's timeout; the
    # aggregator pool has no timeout, and it stays derived as before while bucketlearn.config
    # reads it.
  }

  runtime_env = merge(var.extra_env, local.app_env)

  # What the controller job (`bucketlearn autoscale`: the watchdog's pass, then the resize)
  # needs besides the app settings: which pools to resize and their bounds, and how long a job may
  # stand still before the watchdog acts. Kept out of env_vars because only the controller
  # reads them.
  autoscaler_env = merge({
    BUCKETLEARN_WORKER_POOL     = "projects/${var.project_id}/locations/${var.region}/workerPools/${local.worker_pool_name}"
    BUCKETLEARN_MIN_WORKERS     = tostring(var.min_workers)
    BUCKETLEARN_MAX_WORKERS     = tostring(var.max_workers)
    BUCKETLEARN_AGGREGATOR_POOL = "projects/${var.project_id}/locations/${var.region}/workerPools/${local.aggregator_pool_name}"
    BUCKETLEARN_MIN_AGGREGATORS = tostring(var.min_aggregators)
    BUCKETLEARN_MAX_AGGREGATORS = tostring(var.max_aggregators)
    BUCKETLEARN_STALL_SECONDS   = tostring(var.stall_seconds)
  }, local.dead_letter_drain_env)

  # The dead-letter sink the watchdog drains (each message becomes a failure marker, then is
  # acked), only when tasks are dead-lettered at all. Never in env_vars: the controller is the
  # sink's only consumer, and a CLI pointed at env_vars must not drain it (`bucketlearn watchdog`
  # would).
  dead_letter_drain_env = var.dead_letter_enabled ? {
    BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION = google_pubsub_subscription.dead_letter_sink.name
  } : {}

  worker_pool_name     = "${var.name_prefix}-learners"
  aggregator_pool_name = "${var.name_prefix}-aggregator"

  # Memory Cloud Run allows per whole number of vCPUs, in MiB [min, max] (Cloud Functions 2nd gen
  # run on Cloud Run, so the function follows it too): 1 vCPU up to 4 GiB, 2 up to 8 GiB, 4 from
  # 2 to 16 GiB, 6 from 4 to 24 GiB, 8 from 4 to 32 GiB; never under 512 MiB. Checked by the
  # preconditions of the worker pools and the function (a variable's validation cannot read
  # another variable before Terraform 1.9).
  memory_mib_range_by_cpu = {
    "1" = [512, 4096]
    "2" = [512, 8192]
    "4" = [2048, 16384]
    "6" = [4096, 24576]
    "8" = [4096, 32768]
  }
  worker_memory_mib     = tonumber(regex("^[0-9]+", var.worker_memory)) * (endswith(var.worker_memory, "Gi") ? 1024 : 1)
  aggregator_memory_mib = tonumber(regex("^[0-9]+", var.aggregator_memory)) * (endswith(var.aggregator_memory, "Gi") ? 1024 : 1)
  function_memory_mib   = tonumber(trimsuffix(var.function_memory, "Gi")) * 1024
  # What the split may hold to parse an upload once (bucketlearn.config.Limits.keep_parsed_bytes),
  # by the function's memory, beside up to two 64 MiB groups while it compacts: a 373 MB image
  # CSV is held compact in 113 MB (docs/BENCHMARKS.md section 3); var.extra_env may set it instead
  keep_parsed_bytes = tostring({ "1Gi" = 64, "2Gi" = 256, "4Gi" = 1024, "8Gi" = 2048, "16Gi" = 2048 }[var.function_memory] * 1024 * 1024)

  # Google-managed service agents that get grants in iam.tf.
  pubsub_service_agent = "service-${local.project_number}@gcp-sa-pubsub.iam.gserviceaccount.com"
  iap_service_agent    = "service-${local.project_number}@gcp-sa-iap.iam.gserviceaccount.com"

  firestore_database_resource = "projects/${var.project_id}/databases/${local.firestore_database}"

  apis = toset(concat([
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "eventarc.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "storage.googleapis.com",
    ],
    var.firestore_rules == null ? [] : ["firebaserules.googleapis.com"],
    var.dashboard_access == "iap" ? ["iap.googleapis.com"] : [],
  ))
}

resource "google_project_service" "apis" {
  for_each = var.enable_apis ? local.apis : toset([])

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

# Make Google create the service agents now (they are otherwise created lazily, on first use),
# so the grants to them in iam.tf succeed on a fresh project.
resource "google_project_service_identity" "pubsub" {
  provider = google-beta

  project = var.project_id
  service = "pubsub.googleapis.com"

  depends_on = [google_project_service.apis]
}

resource "google_project_service_identity" "eventarc" {
  provider = google-beta

  project = var.project_id
  service = "eventarc.googleapis.com"

  depends_on = [google_project_service.apis]
}

resource "google_project_service_identity" "iap" {
  provider = google-beta
  count    = var.dashboard_access == "iap" ? 1 : 0

  project = var.project_id
  service = "iap.googleapis.com"

  depends_on = [google_project_service.apis]
}

# The Cloud Storage service agent publishes the bucket notifications behind Eventarc storage
# triggers (the split function's); this data source also creates it if needed.
data "google_storage_project_service_account" "gcs" {
  project = var.project_id

  depends_on = [google_project_service.apis]
}

# --- Artifact Registry -------------------------------------------------------------------------

resource "google_artifact_registry_repository" "images" {
  #checkov:skip=CKV_GCP_84:Images hold only open-source code and bucketlearn itself, no data; Google-managed encryption is sufficient.
  project       = var.project_id
  location      = var.region
  repository_id = var.artifact_repository_id
  format        = "DOCKER"
  description   = "bucketlearn worker and dashboard images"
  labels        = local.labels

  cleanup_policy_dry_run = false

  # KEEP wins over DELETE: the newest versions are kept however old they are.
  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = var.keep_image_versions
    }
  }

  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      tag_state  = "ANY"
      older_than = "2592000s"
    }
  }

  depends_on = [google_project_service.apis]
}
