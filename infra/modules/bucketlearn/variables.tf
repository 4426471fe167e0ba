# --- where -------------------------------------------------------------------------------------

variable "project_id" {
  type        = string
  description = "Google Cloud project id that holds every bucketlearn resource."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a Google Cloud project id: 6-30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "region" {
  type        = string
  description = "Region for the buckets, the split function and its Eventarc trigger, Cloud Run resources, Artifact Registry and Cloud Scheduler. Buckets are regional so that the Eventarc storage trigger can live in the same region."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must be a Google Cloud region such as europe-west1 or us-central1 (not a multi-region)."
  }
}

variable "name_prefix" {
  type        = string
  default     = "bucketlearn"
  description = "Prefix of every resource name (topics, functions, services, service accounts). Bucket names are \"<project_id>-<name_prefix>-<role>\" because bucket names are global."

  validation {
    # Service account ids are 6-30 characters; the longest suffix used is "-autoscaler" (11).
    condition     = can(regex("^[a-z][a-z0-9-]{1,17}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 3-19 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "labels" {
  type        = map(string)
  default     = {}
  description = "Labels added to every resource that takes labels (app=bucketlearn is always added)."
}

variable "enable_apis" {
  type        = bool
  default     = true
  description = "Enable the Google APIs bucketlearn needs (google_project_service, never disabled on destroy). Set false when a platform team manages APIs."
}

variable "deletion_protection" {
  type        = bool
  default     = true
  description = "Protect stateful resources: buckets are not force-destroyed, the Firestore database keeps delete protection and is abandoned (not deleted) on destroy, and Cloud Run resources keep deletion_protection. Set false in throw-away environments so teardown works."
}

# --- storage -----------------------------------------------------------------------------------

variable "work_retention_days" {
  type        = number
  default     = 7
  description = "Days after which objects in the work bucket (shards, holdout, manifests) are deleted by a lifecycle rule. The split refuses a job predicted to train longer than half of it (6 FLOPs per parameter and training row at BUCKETLEARN_WORKER_FLOPS, default 1e9 per learner, plus 1 s per round), with a REJECTED reason naming the prediction; a job that ends deletes its own work objects at once."

  validation {
    condition     = var.work_retention_days >= 1 && var.work_retention_days <= 365 && floor(var.work_retention_days) == var.work_retention_days
    error_message = "work_retention_days must be a whole number from 1 to 365."
  }
}

variable "deltas_retention_days" {
  type        = number
  default     = 1
  description = "Days after which weight deltas are deleted. The aggregator deletes the deltas it has applied; this rule only sweeps leftovers (duplicates, deltas of failed jobs)."

  validation {
    condition     = var.deltas_retention_days >= 1 && var.deltas_retention_days <= 30 && floor(var.deltas_retention_days) == var.deltas_retention_days
    error_message = "deltas_retention_days must be a whole number from 1 to 30."
  }
}

variable "uploads_noncurrent_retention_days" {
  type        = number
  default     = 7
  description = "The uploads bucket is versioned (a job reads its upload by generation, and re-uploading the same name must not pull the old generation from under a running split). Noncurrent generations are deleted after this many days."

  validation {
    condition     = var.uploads_noncurrent_retention_days >= 1 && floor(var.uploads_noncurrent_retention_days) == var.uploads_noncurrent_retention_days
    error_message = "uploads_noncurrent_retention_days must be a whole number of at least 1."
  }
}

variable "models_noncurrent_versions" {
  type        = number
  default     = 5
  description = "The models bucket is versioned (models/<job>/latest.keras is overwritten on every export); a noncurrent generation is deleted once this many newer ones exist, the live one included (so each object keeps at most this many generations), or models_noncurrent_retention_days after it became noncurrent, whichever comes first."

  validation {
    condition     = var.models_noncurrent_versions >= 1 && floor(var.models_noncurrent_versions) == var.models_noncurrent_versions
    error_message = "models_noncurrent_versions must be a whole number of at least 1."
  }
}

variable "models_noncurrent_retention_days" {
  type        = number
  default     = 7
  description = "Days a noncurrent generation in the models bucket is kept, however few newer ones it has: a deleted object (the weights of a finished job, which the aggregator deletes) has no newer generation, so models_noncurrent_versions alone would keep its last copy for ever."

  validation {
    condition     = var.models_noncurrent_retention_days >= 1 && var.models_noncurrent_retention_days <= 3650 && floor(var.models_noncurrent_retention_days) == var.models_noncurrent_retention_days
    error_message = "models_noncurrent_retention_days must be a whole number from 1 to 3650."
  }
}

# --- Pub/Sub -----------------------------------------------------------------------------------

variable "ack_deadline_seconds" {
  type        = number
  default     = 60
  description = "Ack deadline of the tasks subscription; the worker extends its lease while it trains. Passed to the app as BUCKETLEARN_ACK_DEADLINE_SECONDS so both agree."

  validation {
    condition     = var.ack_deadline_seconds >= 10 && var.ack_deadline_seconds <= 600
    error_message = "ack_deadline_seconds must be from 10 to 600 (Pub/Sub limits)."
  }
}

variable "dead_letter_enabled" {
  type        = bool
  default     = true
  description = "Attach a dead-letter policy to the tasks subscription (max_delivery_attempts) and to the results subscription (100 deliveries), each with its own dead-letter topic and sink. Leave true in the cloud; the switch exists for projects whose org policy forbids the Pub/Sub service agent grants."
}

variable "max_delivery_attempts" {
  type        = number
  default     = 10
  description = "Deliveries of one task message before Pub/Sub moves it to the dead-letter topic. The app gives up earlier (max_task_attempts) and records the failure; this is the backstop for messages that crash the worker before it can record anything."

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100 && floor(var.max_delivery_attempts) == var.max_delivery_attempts
    error_message = "max_delivery_attempts must be a whole number from 5 to 100 (Pub/Sub limits)."
  }
}

variable "max_task_attempts" {
  type        = number
  default     = 5
  description = "Attempts the app allows one task before it marks it failed (BUCKETLEARN_MAX_TASK_ATTEMPTS). Must be below max_delivery_attempts so the app, not the dead-letter topic, normally decides."

  validation {
    condition     = var.max_task_attempts >= 1 && floor(var.max_task_attempts) == var.max_task_attempts
    error_message = "max_task_attempts must be a whole number of at least 1."
  }
}

variable "retry_minimum_backoff" {
  type        = string
  default     = "10s"
  description = "Minimum delay before Pub/Sub redelivers a nacked or expired task (exponential backoff)."

  validation {
    condition     = can(regex("^[0-9]+s$", var.retry_minimum_backoff)) && try(tonumber(trimsuffix(var.retry_minimum_backoff, "s")) <= 600, false)
    error_message = "retry_minimum_backoff must be a duration in whole seconds, such as \"10s\", of at most 600s."
  }
}

variable "retry_maximum_backoff" {
  type        = string
  default     = "600s"
  description = "Maximum delay before Pub/Sub redelivers a nacked or expired task (exponential backoff)."

  validation {
    condition     = can(regex("^[0-9]+s$", var.retry_maximum_backoff)) && try(tonumber(trimsuffix(var.retry_maximum_backoff, "s")) <= 600, false)
    error_message = "retry_maximum_backoff must be a duration in whole seconds, such as \"600s\", of at most 600s."
  }
}

variable "message_retention_duration" {
  type        = string
  default     = "604800s"
  description = "How long unacknowledged task messages are kept (default 7 days). The dead-letter sink always keeps its messages 7 days, the maximum."

  validation {
    condition     = can(regex("^[0-9]+s$", var.message_retention_duration)) && try(tonumber(trimsuffix(var.message_retention_duration, "s")) >= 600 && tonumber(trimsuffix(var.message_retention_duration, "s")) <= 604800, false)
    error_message = "message_retention_duration must be from \"600s\" to \"604800s\"."
  }
}

variable "enable_exactly_once_delivery" {
  type        = bool
  default     = false
  description = "Pub/Sub exactly-once delivery on the tasks subscription. Off by default: the aggregator is idempotent on task ids anyway (invariant 2) and exactly-once lowers throughput."
}

variable "alert_notification_channels" {
  type        = list(string)
  default     = []
  description = "Cloud Monitoring notification channel ids for the alerts on dead-lettered task and result messages (the alerts exist either way and show in the console)."
}

# --- Firestore ---------------------------------------------------------------------------------

variable "firestore_database" {
  type        = string
  default     = null
  description = "Firestore database id (BUCKETLEARN_FIRESTORE_DATABASE). null: \"<name_prefix>-db\", one per environment, so two name_prefixes in a project never share collections. \"(default)\" uses the project's default database (the one with the free quota): give it explicitly to keep using a (default) database an earlier version of this module made (infra/README.md)."

  validation {
    condition     = var.firestore_database == null || var.firestore_database == "(default)" || can(regex("^[a-z][a-z0-9-]{2,61}[a-z0-9]$", var.firestore_database))
    error_message = "firestore_database must be null, \"(default)\" or 4-63 lowercase letters, digits or hyphens starting with a letter and ending with a letter or digit."
  }
}

variable "create_firestore_database" {
  type        = bool
  default     = true
  description = "Create the Firestore database. Set false when the project already has it (a project has one (default) database; import it instead if you want Terraform to own it)."
}

variable "firestore_location" {
  type        = string
  default     = null
  description = "Firestore location id (a region such as europe-west1, or a multi-region such as eur3 / nam5). Defaults to var.region. Cannot be changed after creation."
}

variable "firestore_point_in_time_recovery" {
  type        = bool
  default     = false
  description = "Enable Firestore point-in-time recovery (7 days of versions, billed as storage)."
}

variable "firestore_rules" {
  type        = string
  default     = null
  description = "Contents of the Firestore security rules to release (infra/firestore.rules denies all client access; server code uses IAM and is not subject to rules). null: do not manage rules."
}

variable "firestore_iam_condition" {
  type        = bool
  default     = true
  description = "Add an IAM condition (resource.name == projects/<p>/databases/<db>) to the project-level Firestore grants (roles/datastore.user: Firestore has no per-database IAM resource), so each component's account can use this environment's database only: another environment in the project (another name_prefix, its own database) gets no Firestore role from this one, and this one none on it. On by default. Turn it off only if your organization's policy refuses conditional role bindings; the grants then cover every database in the project, so keep one environment per project."
}

# --- Cloud Functions ---------------------------------------------------------------------------

variable "function_source_zip" {
  type        = string
  description = "Path to the zip holding functions/main.py, functions/requirements.txt and a vendored copy of bucketlearn/ (infra/package-functions.sh builds it). Its MD5 is part of the object name, so a changed zip redeploys the split function."

  validation {
    condition     = endswith(var.function_source_zip, ".zip")
    error_message = "function_source_zip must be the path of a .zip file."
  }
}

variable "function_runtime" {
  type        = string
  default     = "python311"
  description = "Cloud Functions runtime of the split function."

  validation {
    condition     = contains(["python311", "python312"], var.function_runtime)
    error_message = "function_runtime must be python311 or python312 (bucketlearn supports Python 3.11 and 3.12)."
  }
}

variable "function_memory" {
  type        = string
  default     = "2Gi"
  description = "Memory of each split function instance; TensorFlow plus one model and one shard fits in 2Gi. 8Gi needs function_cpu >= 2, 16Gi needs >= 4."

  validation {
    condition     = contains(["1Gi", "2Gi", "4Gi", "8Gi", "16Gi"], var.function_memory)
    error_message = "function_memory must be one of 1Gi, 2Gi, 4Gi, 8Gi, 16Gi."
  }
}

variable "function_cpu" {
  type        = string
  default     = "1"
  description = "vCPUs of each split function instance. Must fit function_memory as Cloud Run requires (checked at plan): 1 vCPU allows up to 4Gi, 2 up to 8Gi, 4 needs 2Gi-16Gi, 8 needs 4Gi-32Gi."

  validation {
    condition     = contains(["1", "2", "4", "8"], var.function_cpu)
    error_message = "function_cpu must be one of 1, 2, 4, 8."
  }
}

variable "function_timeout_seconds" {
  type        = number
  default     = 540
  description = "Timeout of each split function invocation; Eventarc-triggered functions allow at most 540 s."

  validation {
    condition     = var.function_timeout_seconds >= 60 && var.function_timeout_seconds <= 540
    error_message = "function_timeout_seconds must be from 60 to 540."
  }
}

variable "split_max_instances" {
  type        = number
  default     = 5
  description = "Maximum instances of the split (upload) function; one upload per instance at a time."

  validation {
    condition     = var.split_max_instances >= 1 && var.split_max_instances <= 100
    error_message = "split_max_instances must be from 1 to 100."
  }
}

variable "build_service_account" {
  type        = string
  default     = null
  description = "Email of an existing service account for Cloud Build (the function builds, and the image builds infra/deploy.sh submits); it needs roles/logging.logWriter on the project, roles/artifactregistry.writer on the images repository (the function build pushes there too), roles/storage.objectAdmin on the gcf-v2-sources-<project number>-<region> bucket, roles/storage.objectViewer on <project>_cloudbuild and on the module's sources bucket, and no role on the pipeline's buckets. null: the module creates <name_prefix>-build with exactly those grants (the bucket ones as IAM conditions on project-level grants where the bucket is not the module's). The project's default build account is never used: in projects created since mid-2024 it is the Compute Engine default service account, without the roles a build needs."
}

variable "iam_propagation_wait" {
  type        = string
  default     = "120s"
  description = "How long to wait, once, between creating the grants and service agents the split function needs (the Eventarc and Cloud Storage service agents, the trigger and build accounts) and creating the function. IAM changes take minutes to propagate, and Eventarc grants its own service agent its role only when the API is first enabled; without the wait the first apply on a fresh project can fail and a rerun works. \"0s\" disables it."

  validation {
    condition     = can(regex("^[0-9]+s$", var.iam_propagation_wait))
    error_message = "iam_propagation_wait must be whole seconds, such as \"120s\"."
  }
}

# --- images ------------------------------------------------------------------------------------

variable "artifact_repository_id" {
  type        = string
  default     = "bucketlearn"
  description = "Id of the Artifact Registry Docker repository created for the worker and dashboard images."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,62}$", var.artifact_repository_id))
    error_message = "artifact_repository_id must be lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "keep_image_versions" {
  type        = number
  default     = 10
  description = "Artifact Registry cleanup keeps this many most recent versions of each image; older ones are deleted after 30 days."

  validation {
    condition     = var.keep_image_versions >= 1
    error_message = "keep_image_versions must be at least 1."
  }
}

variable "worker_image" {
  type        = string
  description = "Learner worker image (workers/Dockerfile), preferably by digest: REGION-docker.pkg.dev/PROJECT/REPO/worker@sha256:... The autoscaler job runs the same image."

  validation {
    condition     = length(regexall("^[a-z0-9.-]+(:[0-9]+)?/[^ ]+(:[A-Za-z0-9_.-]+|@sha256:[0-9a-f]{64})$", var.worker_image)) == 1
    error_message = "worker_image must be a full image reference with a tag or a digest, such as europe-west1-docker.pkg.dev/p/bucketlearn/worker:abc123."
  }
}

variable "dashboard_image" {
  type        = string
  description = "Dashboard image (dashboard/Dockerfile), preferably by digest."

  validation {
    condition     = length(regexall("^[a-z0-9.-]+(:[0-9]+)?/[^ ]+(:[A-Za-z0-9_.-]+|@sha256:[0-9a-f]{64})$", var.dashboard_image)) == 1
    error_message = "dashboard_image must be a full image reference with a tag or a digest."
  }
}

# --- workers and autoscaler --------------------------------------------------------------------

variable "min_workers" {
  type        = number
  default     = 0
  description = "Fewest learner workers the autoscaler keeps (0: scale to zero when there is no backlog). Also the instance count the worker pool is created with."

  validation {
    condition     = var.min_workers >= 0 && floor(var.min_workers) == var.min_workers
    error_message = "min_workers must be a whole number of at least 0."
  }
}

variable "max_workers" {
  type        = number
  default     = 10
  description = "Most learner workers the autoscaler starts."

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 1000 && floor(var.max_workers) == var.max_workers
    error_message = "max_workers must be a whole number from 1 to 1000."
  }
}

variable "worker_cpu" {
  type        = string
  default     = "2"
  description = "vCPUs of each learner worker. Must fit worker_memory as Cloud Run requires (checked at plan): 1 vCPU allows 512Mi-4Gi, 2 allows 512Mi-8Gi, 4 needs 2Gi-16Gi, 6 needs 4Gi-24Gi, 8 needs 4Gi-32Gi."

  validation {
    condition     = contains(["1", "2", "4", "6", "8"], var.worker_cpu)
    error_message = "worker_cpu must be one of 1, 2, 4, 6, 8."
  }
}

variable "worker_memory" {
  type        = string
  default     = "4Gi"
  description = "Memory of each learner worker (one model and one shard), such as 4Gi or 3072Mi; from 512Mi to 32Gi and within what worker_cpu allows (see worker_cpu)."

  validation {
    condition     = can(regex("^[0-9]+(Mi|Gi)$", var.worker_memory))
    error_message = "worker_memory must look like 4Gi or 2048Mi."
  }
}

variable "min_aggregators" {
  type        = number
  default     = 0
  description = "Fewest aggregator instances the autoscaler keeps (0: none while no job is active; the autoscaler starts one within a minute of a new job, so 1 saves that minute at the cost of an idle instance). Also the instance count the aggregator pool is created with."

  validation {
    condition     = var.min_aggregators >= 0 && var.min_aggregators <= 10 && floor(var.min_aggregators) == var.min_aggregators
    error_message = "min_aggregators must be a whole number from 0 to 10."
  }
}

variable "max_aggregators" {
  type        = number
  default     = 1
  description = "Most aggregator instances the autoscaler starts. One aggregator serves every job: a job is held by one aggregator at a time through a Firestore lease (the single writer of its versions), so more instances only help when many jobs run at once; they never speed up one job."

  validation {
    condition     = var.max_aggregators >= 1 && var.max_aggregators <= 10 && floor(var.max_aggregators) == var.max_aggregators
    error_message = "max_aggregators must be a whole number from 1 to 10."
  }
}

variable "aggregator_cpu" {
  type        = string
  default     = "1"
  description = "vCPUs of each aggregator instance (folds, evaluation on the holdout sample, export). Must fit aggregator_memory as Cloud Run requires (checked at plan): 1 vCPU allows 512Mi-4Gi, 2 allows 512Mi-8Gi, 4 needs 2Gi-16Gi, 6 needs 4Gi-24Gi, 8 needs 4Gi-32Gi."

  validation {
    condition     = contains(["1", "2", "4", "6", "8"], var.aggregator_cpu)
    error_message = "aggregator_cpu must be one of 1, 2, 4, 6, 8."
  }
}

variable "aggregator_memory" {
  type        = string
  default     = "2Gi"
  description = "Memory of each aggregator instance (a model, its weights and optimizer state, a round's results, the holdout sample), such as 2Gi or 3072Mi; from 512Mi to 32Gi and within what aggregator_cpu allows (see aggregator_cpu)."

  validation {
    condition     = can(regex("^[0-9]+(Mi|Gi)$", var.aggregator_memory))
    error_message = "aggregator_memory must look like 2Gi or 2048Mi."
  }
}

variable "worker_pool_launch_stage" {
  type        = string
  default     = "BETA"
  description = "launch_stage sent for the worker pools (learners, aggregator) and the dashboard service. BETA lets the API accept worker-pool manual scaling and Cloud Run IAP while they are in preview; GA once both are GA in your project. Later drift of this field is ignored."

  validation {
    condition     = contains(["ALPHA", "BETA", "GA"], var.worker_pool_launch_stage)
    error_message = "worker_pool_launch_stage must be ALPHA, BETA or GA."
  }
}

variable "autoscaler_schedule" {
  type        = string
  default     = "* * * * *"
  description = "Cron schedule (UTC) of the autoscaler job; every minute by default, the finest Cloud Scheduler allows."

  validation {
    condition     = length(split(" ", trimspace(var.autoscaler_schedule))) == 5
    error_message = "autoscaler_schedule must be a five-field cron expression."
  }
}

variable "autoscaler_paused" {
  type        = bool
  default     = false
  description = "Pause the Cloud Scheduler job that runs the autoscaler (the learner and aggregator pools then keep their current instance counts, and the watchdog does not run)."
}

variable "stall_seconds" {
  type        = number
  default     = 600
  description = "Seconds a job may show no progress (no update, no task of its current round starting or finishing) before the controller's watchdog acts on it: publishes the round's missing tasks again or nudges the aggregator with a message on the results topic (BUCKETLEARN_STALL_SECONDS, read by the autoscaler job only). Above ack_deadline_seconds, so a task whose worker died is redelivered by Pub/Sub first; a task that trains longer than this is trained twice and applied once."

  validation {
    condition     = var.stall_seconds >= 60 && var.stall_seconds <= 86400 && floor(var.stall_seconds) == var.stall_seconds
    error_message = "stall_seconds must be a whole number from 60 (the controller runs every minute) to 86400."
  }
}

variable "scheduler_region" {
  type        = string
  default     = null
  description = "Region of the Cloud Scheduler job when var.region has no Cloud Scheduler (null: var.region)."
}

# --- dashboard ---------------------------------------------------------------------------------

variable "dashboard_access" {
  type        = string
  default     = "iap"
  description = <<-EOT
    How people reach the dashboard; it is never public (no allUsers invoker):
      "iap"         - Identity-Aware Proxy enabled directly on the Cloud Run service; only
                      dashboard_users get through (roles/iap.httpsResourceAccessor).
      "internal_lb" - ingress restricted to internal traffic and Cloud Load Balancing; put your
                      own HTTPS load balancer (with IAP) in front; dashboard_users get run.invoker.
  EOT

  validation {
    condition     = contains(["iap", "internal_lb"], var.dashboard_access)
    error_message = "dashboard_access must be \"iap\" or \"internal_lb\"."
  }
}

variable "dashboard_users" {
  type        = list(string)
  default     = []
  description = "IAM principals allowed to use the dashboard, e.g. [\"user:ana@example.com\", \"group:ml@example.com\"]. allUsers and allAuthenticatedUsers are refused."

  validation {
    condition = alltrue([
      for m in var.dashboard_users :
      can(regex("^(user|group|domain|serviceAccount|principal|principalSet):.+", m))
    ])
    error_message = "Each dashboard_users entry must be an IAM principal with a type prefix (user:, group:, domain:, serviceAccount:, principal:, principalSet:); allUsers and allAuthenticatedUsers are not allowed."
  }
}

variable "dashboard_max_instances" {
  type        = number
  default     = 2
  description = "Maximum dashboard instances (Streamlit keeps a websocket per viewer; session affinity is on)."

  validation {
    condition     = var.dashboard_max_instances >= 1 && var.dashboard_max_instances <= 100
    error_message = "dashboard_max_instances must be from 1 to 100."
  }
}

# --- app settings ------------------------------------------------------------------------------

variable "extra_env" {
  type        = map(string)
  default     = {}
  description = "More BUCKETLEARN_* settings for every component: limits (BUCKETLEARN_MAX_FILE_BYTES, ...; what one upload may cost: BUCKETLEARN_MAX_TOTAL_TASKS, a job's tasks over all its epochs, default 200000; BUCKETLEARN_MAX_SHARD_BYTES, one shard's arrays as a learner holds them, default 268435456 = 256 MiB, keep it well under worker_memory since a task of a one-at-a-time job reads up to 4 shards; BUCKETLEARN_MAX_COUNTED_VALUES, distinct text values the split holds while counting, all columns together, default 2000000; BUCKETLEARN_MAX_PREDICT_BYTES, a batch prediction's input (predict/<job>/<name>.csv), default 1073741824 = 1 GiB; BUCKETLEARN_MAX_PREDICT_REQUESTS, prediction requests a job, default 1000; BUCKETLEARN_PREDICT_PART_BYTES, a batch prediction larger than this is predicted in parts of about this size (at most 32) by the learners, default 16777216 = 16 MiB, 0: always in the function; BUCKETLEARN_KEEP_PARSED_BYTES, what the split may hold to parse an upload once (its parsed rows, held compact where whole numbers allow), set by the module from function_memory: 64 MiB at 1Gi, 256 MiB at 2Gi, 1 GiB at 4Gi, 2 GiB above), job defaults (BUCKETLEARN_DEFAULT_EPOCHS, ...), BUCKETLEARN_LEASE_SECONDS, BUCKETLEARN_EVAL_MAX_ROWS, BUCKETLEARN_MAX_EVENT_AGE_SECONDS, BUCKETLEARN_SCALE_DOWN_COOLDOWN_SECONDS, BUCKETLEARN_WORKER_MAX_MODELS (models, one per job, a learner process builds before a fresh process replaces it; 0: never), BUCKETLEARN_AGGREGATOR_LEASE_SECONDS (a job's aggregation lease, renewed every third of it; default 15), BUCKETLEARN_CHAIN_GRACE_SECONDS (R = 1: how long the aggregator waits for a chained round beyond its last task's time before publishing it for every learner; default 10), BUCKETLEARN_EVAL_FLUSH_SECONDS (an evaluation no commit carried is written on its own after this; default 2), BUCKETLEARN_EVAL_CPU_SHARE (the share of a core the aggregator's evaluator of versions may take, resting between evaluations; default 0.25, 1: back to back), BUCKETLEARN_WORKER_CACHE_BYTES (shard parts a learner keeps in memory; default 512 MiB), BUCKETLEARN_CALL_LOG (a directory where each process logs its remote calls, for benchmarks), BUCKETLEARN_AGGREGATE_BUDGET_SECONDS (bounds the synchronous aggregation pass of tests and the simulation; no deployed component reads it). Names the module sets itself (for every component or for the autoscaler job) cannot be given here; use their variables (stall_seconds, min_workers, max_aggregators, ...)."

  validation {
    condition = alltrue([
      for k in keys(var.extra_env) : can(regex("^BUCKETLEARN_[A-Z0-9_]+$", k)) && !contains([
        "BUCKETLEARN_PROJECT", "BUCKETLEARN_UPLOADS_BUCKET", "BUCKETLEARN_WORK_BUCKET",
        "BUCKETLEARN_DELTAS_BUCKET", "BUCKETLEARN_MODELS_BUCKET", "BUCKETLEARN_TASKS_TOPIC",
        "BUCKETLEARN_TASKS_SUBSCRIPTION", "BUCKETLEARN_FIRESTORE_DATABASE",
        "BUCKETLEARN_ACK_DEADLINE_SECONDS", "BUCKETLEARN_MAX_TASK_ATTEMPTS", "BUCKETLEARN_LOG_FORMAT",
        "BUCKETLEARN_WORK_RETENTION_DAYS",
        "BUCKETLEARN_RESULTS_TOPIC", "BUCKETLEARN_RESULTS_SUBSCRIPTION",
        "BUCKETLEARN_WORKER_POOL", "BUCKETLEARN_MIN_WORKERS", "BUCKETLEARN_MAX_WORKERS",
        "BUCKETLEARN_AGGREGATOR_POOL", "BUCKETLEARN_MIN_AGGREGATORS", "BUCKETLEARN_MAX_AGGREGATORS",
        "BUCKETLEARN_STALL_SECONDS", "BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION",
      ], k)
    ])
    error_message = "extra_env keys must be BUCKETLEARN_* names other than the ones the module sets (buckets, topics, subscriptions, database, project, ack deadline, max task attempts, log format, work retention days (set work_retention_days), the autoscaler job's worker and aggregator pools, their min/max counts, stall seconds and dead-letter subscription: set stall_seconds, min_workers, max_workers, min_aggregators, max_aggregators instead)."
  }
}
