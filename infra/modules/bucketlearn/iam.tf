# One service account per component, each granted only what its code does, on the one bucket,
# topic, subscription, service or job it touches. No primitive roles (owner/editor/viewer), no
# allUsers/allAuthenticatedUsers. Project-level grants exist only where the service has no
# narrower resource (each says why).
#
# Bucket roles, chosen from what the code writes (bucketlearn/layout.py):
#   objectViewer  read + list
#   objectCreator create only: enough for write-once names (deltas, weights carry a random nonce)
#   objectUser    read, list, create, overwrite, delete: needed where names are rewritten
#                 (re-delivered split rewrites shards; latest.keras is overwritten; the aggregator
#                 and split delete what they consumed / abandoned)
#
# Pub/Sub roles, on one topic or subscription each:
#   tasks topic              publisher: split (round 0), aggregator (next rounds), autoscaler
#                            (lost tasks)
#   tasks subscription       subscriber: learners
#   results topic            publisher: learners ("result ready"), autoscaler (nudges),
#                            aggregator (a task it gives up on after its refused results),
#                            dashboard (a nudge after its "Cancel job")
#   results subscription     subscriber: aggregator (acks a result once it is folded, or
#                            once it finds it cannot take it)
#   dead-letter sink         subscriber: autoscaler (its only consumer)
#   results dead-letter sink none: kept for an operator, who reads it with their own access
#   Pub/Sub service agent    publisher on each dead-letter topic, subscriber on the
#                            subscription it dead-letters from (with dead_letter_enabled)

# --- service accounts --------------------------------------------------------------------------

resource "google_service_account" "split" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-split"
  display_name = "bucketlearn split function"
  description  = "Runs the on_upload Cloud Function: reads uploads, writes shards, creates jobs, publishes tasks; predicts predict/ uploads with a job's exported model."

  depends_on = [google_project_service.apis]
}

# The account id keeps its old name ("-aggregate", from the aggregate function this pool
# replaced), so existing deployments keep their account and its grants.
resource "google_service_account" "aggregate" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-aggregate"
  display_name = "bucketlearn aggregator"
  description  = "Runs the aggregator worker pool: pulls result messages, folds results into versions, publishes the next round, exports models."

  depends_on = [google_project_service.apis]
}

resource "google_service_account" "worker" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-worker"
  display_name = "bucketlearn learner worker"
  description  = "Runs the learner worker pool: pulls tasks, reads shards and weights, writes results, announces them on the results topic; predicts the parts of large batch predictions."

  depends_on = [google_project_service.apis]
}

resource "google_service_account" "dashboard" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-dashboard"
  display_name = "bucketlearn dashboard"
  description  = "Runs the Streamlit dashboard: reads Firestore and models, writes CSV uploads, cancels jobs."

  depends_on = [google_project_service.apis]
}

resource "google_service_account" "autoscaler" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-autoscaler"
  display_name = "bucketlearn autoscaler"
  description  = "Runs `bucketlearn autoscale`: the watchdog (republishes lost tasks, drains dead letters, nudges stalled jobs), then sets the learner and aggregator pools' instance counts."

  depends_on = [google_project_service.apis]
}

resource "google_service_account" "scheduler" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-scheduler"
  display_name = "bucketlearn autoscaler trigger"
  description  = "Identity of the Cloud Scheduler job that starts the autoscaler job; may only run that job."

  depends_on = [google_project_service.apis]
}

resource "google_service_account" "eventarc" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-events"
  display_name = "bucketlearn Eventarc trigger"
  description  = "Identity of the split function's Eventarc storage trigger; may only receive events and invoke that function."

  depends_on = [google_project_service.apis]
}

# Cloud Build runs the build of the split function and of the worker and dashboard images
# (infra/deploy.sh passes it to `gcloud builds submit`) as this account. Not the project's
# default build account: in projects created since mid-2024 that is the Compute Engine default
# service account, which lacks the roles a build needs (and has far more than it needs).
resource "google_service_account" "build" {
  count = var.build_service_account == null ? 1 : 0

  project      = var.project_id
  account_id   = "${var.name_prefix}-build"
  display_name = "bucketlearn builds"
  description  = "Runs the Cloud Build builds of the split function and of the worker and dashboard images."

  depends_on = [google_project_service.apis]
}

locals {
  build_service_account = var.build_service_account == null ? google_service_account.build[0].email : var.build_service_account

  # The buckets a build reads or writes, none of them the pipeline's: a hostile package in a
  # build (a dependency's setup script runs as this account) must not reach uploads, work,
  # deltas or models (models/*/latest.keras is what users load).
  #   gcf-v2-sources-<number>-<region>  the split function's build: Cloud Functions copies the
  #                                     archive named in build_config.source (our sources
  #                                     bucket) here and the build fetches it from here; the
  #                                     bucket belongs to Cloud Functions (made on the first
  #                                     deploy in the region), so there is no bucket resource to
  #                                     grant on. Not gcf-v2-uploads-*: only `gcloud functions
  #                                     deploy` from a local directory uploads there.
  #   <project>_cloudbuild              the image builds: `gcloud builds submit` (deploy.sh)
  #                                     uploads the source tarball here as the deploying user,
  #                                     and the build fetches it; made by gcloud, not Terraform.
  # The module's own sources bucket gets a bucket-level grant (below). Each condition matches
  # the bucket or an object in it, never a bucket whose name merely starts the same
  # (europe-west1 is a prefix of europe-west10).
  build_function_source_bucket = "gcf-v2-sources-${local.project_number}-${var.region}"
  build_image_source_bucket    = "${var.project_id}_cloudbuild"

  # Project level, each for a reason:
  #   logging.logWriter   a build writes its logs to Cloud Logging (cloudbuild.yaml:
  #                       CLOUD_LOGGING_ONLY); there is no narrower resource to write logs to.
  #   storage.objectAdmin on gcf-v2-sources-* only (IAM condition): what Cloud Functions
  #                       documents a custom build account needs there (fetch the source, write
  #                       what the build stores next to it).
  #   storage.objectViewer on <project>_cloudbuild only (IAM condition): the image builds only
  #                       fetch their source tarball.
  # Artifact Registry is not here: the writer role is on the images repository alone, and the
  # function build pushes there too (build_config.docker_repository), not to gcf-artifacts.
  build_roles = var.build_service_account == null ? {
    "roles/logging.logWriter" = {
      role        = "roles/logging.logWriter"
      title       = null
      description = null
      expression  = null
    }
    "roles/storage.objectAdmin" = {
      role        = "roles/storage.objectAdmin"
      title       = "bucketlearn-build-function-source"
      description = "Only the Cloud Functions source bucket of this region (the split function's build)"
      expression  = "resource.name == \"projects/_/buckets/${local.build_function_source_bucket}\" || resource.name.startsWith(\"projects/_/buckets/${local.build_function_source_bucket}/\")"
    }
    "roles/storage.objectViewer" = {
      role        = "roles/storage.objectViewer"
      title       = "bucketlearn-build-image-source"
      description = "Only the bucket gcloud builds submit uploads the image builds' source to"
      expression  = "resource.name == \"projects/_/buckets/${local.build_image_source_bucket}\" || resource.name.startsWith(\"projects/_/buckets/${local.build_image_source_bucket}/\")"
    }
  } : {}
}

resource "google_project_iam_member" "build" {
  for_each = local.build_roles

  project = var.project_id
  role    = each.value.role
  member  = "serviceAccount:${local.build_service_account}"

  dynamic "condition" {
    for_each = each.value.expression == null ? [] : [each.value]
    content {
      title       = condition.value.title
      description = condition.value.description
      expression  = condition.value.expression
    }
  }
}

# The function and image builds push to the images repository only (the split function's build
# is pointed at it with build_config.docker_repository): writer on that one repository.
resource "google_artifact_registry_repository_iam_member" "build_writer" {
  count = var.build_service_account == null ? 1 : 0

  project    = var.project_id
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.writer"
  member     = "serviceAccount:${local.build_service_account}"
}

# The split function's source archive (build_config.source): read only. Cloud Functions copies it
# to gcf-v2-sources-* before the build; the grant covers a build that reads it directly.
resource "google_storage_bucket_iam_member" "build_sources_viewer" {
  count = var.build_service_account == null ? 1 : 0

  bucket = google_storage_bucket.sources.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${local.build_service_account}"
}

# --- Cloud Storage -----------------------------------------------------------------------------

locals {
  split_bucket_roles = {
    uploads = { bucket = google_storage_bucket.uploads.name, role = "roles/storage.objectViewer" }
    work    = { bucket = google_storage_bucket.work.name, role = "roles/storage.objectUser" }
    models  = { bucket = google_storage_bucket.models.name, role = "roles/storage.objectCreator" }
  }

  # Batch prediction (predict/<job>/<name>.csv in the uploads bucket, which the split function
  # already reads): the function reads a job's exported model (models/<job>/latest.keras) and
  # writes predictions/<job>/<name>.csv, which a new upload of the same name replaces (a
  # replace needs delete). Each grant is held to its prefix by an IAM condition on the object's
  # name, so the function can neither read weights/ nor replace or delete an exported model.
  # The dashboard's objectViewer on the models bucket already reads predictions/.
  split_models_prefix_roles = {
    models_read       = { prefix = "models/", role = "roles/storage.objectViewer" }
    predictions_write = { prefix = "predictions/", role = "roles/storage.objectUser" }
  }

  aggregate_bucket_roles = {
    work   = { bucket = google_storage_bucket.work.name, role = "roles/storage.objectViewer" }
    deltas = { bucket = google_storage_bucket.deltas.name, role = "roles/storage.objectUser" }
    models = { bucket = google_storage_bucket.models.name, role = "roles/storage.objectUser" }
  }

  worker_bucket_roles = {
    work   = { bucket = google_storage_bucket.work.name, role = "roles/storage.objectViewer" }
    models = { bucket = google_storage_bucket.models.name, role = "roles/storage.objectViewer" }
    deltas = { bucket = google_storage_bucket.deltas.name, role = "roles/storage.objectCreator" }
  }

  # A large batch prediction is fanned out in parts over the learners: a learner reads its
  # part of predict/<job>/<name>.csv in the uploads bucket, writes the part under
  # predictions/.parts/<job>/ in the models bucket, and the last part composes them into
  # predictions/<job>/<name>.csv and deletes them (compose and delete need objectUser). Each
  # grant is held to its prefix by an IAM condition on the object's name.
  worker_prefix_roles = {
    predict_read = {
      bucket = google_storage_bucket.uploads.name, prefix = "predict/", role = "roles/storage.objectViewer"
    }
    predictions_write = {
      bucket = google_storage_bucket.models.name, prefix = "predictions/", role = "roles/storage.objectUser"
    }
  }

  # The upload form writes each file under a name of its own (dashboard/<16 random hex>/<name>),
  # never over another object: create-only (objectCreator), no read, no delete, so the dashboard
  # can neither replace nor remove what anyone uploaded (issue #26, item 3).
  dashboard_bucket_roles = {
    uploads = { bucket = google_storage_bucket.uploads.name, role = "roles/storage.objectCreator" }
    models  = { bucket = google_storage_bucket.models.name, role = "roles/storage.objectViewer" }
  }

  # The controller's watchdog lists a job's results in the deltas bucket and writes failure
  # markers there (write-once names with a random nonce: create, never overwrite or delete - the
  # aggregator deletes them; its nudges are messages on the results topic now); it reads a job's
  # manifest (jobs/<job>/manifest.json) in the work bucket to publish lost tasks again. Viewer +
  # creator, not objectUser (which carries delete).
  autoscaler_bucket_roles = {
    deltas_viewer  = { bucket = google_storage_bucket.deltas.name, role = "roles/storage.objectViewer" }
    deltas_creator = { bucket = google_storage_bucket.deltas.name, role = "roles/storage.objectCreator" }
    work_viewer    = { bucket = google_storage_bucket.work.name, role = "roles/storage.objectViewer" }
  }
}

resource "google_storage_bucket_iam_member" "split" {
  for_each = local.split_bucket_roles

  bucket = each.value.bucket
  role   = each.value.role
  member = "serviceAccount:${google_service_account.split.email}"
}

resource "google_storage_bucket_iam_member" "split_models_prefixes" {
  for_each = local.split_models_prefix_roles

  bucket = google_storage_bucket.models.name
  role   = each.value.role
  member = "serviceAccount:${google_service_account.split.email}"

  condition {
    title       = "bucketlearn-split-${each.key}"
    description = "Objects under ${each.value.prefix} in the models bucket only (batch prediction)."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.models.name}/objects/${each.value.prefix}\")"
  }
}

resource "google_storage_bucket_iam_member" "aggregate" {
  for_each = local.aggregate_bucket_roles

  bucket = each.value.bucket
  role   = each.value.role
  member = "serviceAccount:${google_service_account.aggregate.email}"
}

resource "google_storage_bucket_iam_member" "worker" {
  for_each = local.worker_bucket_roles

  bucket = each.value.bucket
  role   = each.value.role
  member = "serviceAccount:${google_service_account.worker.email}"
}

resource "google_storage_bucket_iam_member" "worker_prefixes" {
  for_each = local.worker_prefix_roles

  bucket = each.value.bucket
  role   = each.value.role
  member = "serviceAccount:${google_service_account.worker.email}"

  condition {
    title       = "bucketlearn-worker-${each.key}"
    description = "Objects under ${each.value.prefix} only (batch prediction parts)."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${each.value.bucket}/objects/${each.value.prefix}\")"
  }
}

resource "google_storage_bucket_iam_member" "dashboard" {
  for_each = local.dashboard_bucket_roles

  bucket = each.value.bucket
  role   = each.value.role
  member = "serviceAccount:${google_service_account.dashboard.email}"
}

resource "google_storage_bucket_iam_member" "autoscaler" {
  for_each = local.autoscaler_bucket_roles

  bucket = each.value.bucket
  role   = each.value.role
  member = "serviceAccount:${google_service_account.autoscaler.email}"
}

# --- Pub/Sub -----------------------------------------------------------------------------------

resource "google_pubsub_topic_iam_member" "split_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.tasks.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.split.email}"
}

resource "google_pubsub_topic_iam_member" "aggregate_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.tasks.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.aggregate.email}"
}

resource "google_pubsub_subscription_iam_member" "worker_subscriber" {
  project      = var.project_id
  subscription = google_pubsub_subscription.tasks.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${google_service_account.worker.email}"
}

# A learner announces each result it wrote to the deltas bucket.
resource "google_pubsub_topic_iam_member" "worker_results_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.results.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.worker.email}"
}

# The aggregator announces a task it gave up on (its result refused MAX_REFUSALS times) on the
# results topic, as a learner announces a task whose attempts ran out.
resource "google_pubsub_topic_iam_member" "aggregator_results_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.results.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.aggregate.email}"
}

# The dashboard's "Cancel job" publishes a small nudge for the job on the results topic, so the
# aggregator wakes and exports the cancelled job's last version (as the watchdog's nudges do).
# Publish only: it pulls nothing. (The CLI's cancel runs with the user's own credentials.)
resource "google_pubsub_topic_iam_member" "dashboard_results_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.results.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.dashboard.email}"
}

# The aggregator pulls result messages and acks each once it is folded (or once it finds it
# cannot take it); it is the results subscription's only consumer (the Pub/Sub service agent's
# grant below only lets it forward a dead letter).
resource "google_pubsub_subscription_iam_member" "aggregator_results_subscriber" {
  project      = var.project_id
  subscription = google_pubsub_subscription.results.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${google_service_account.aggregate.email}"
}

# The controller's watchdog publishes the tasks of a stalled round again.
resource "google_pubsub_topic_iam_member" "autoscaler_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.tasks.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.autoscaler.email}"
}

# ... and nudges the aggregator about a stalled job with a message on the results topic.
resource "google_pubsub_topic_iam_member" "autoscaler_results_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.results.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.autoscaler.email}"
}

# The controller's watchdog drains the dead-letter sink (pull, then ack once the failure marker
# is written to the deltas bucket). It is the sink's only consumer. With dead_letter_enabled =
# false nothing reaches the sink, and the controller gets neither this grant nor
# BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION (main.tf).
resource "google_pubsub_subscription_iam_member" "autoscaler_dead_letter_subscriber" {
  count = var.dead_letter_enabled ? 1 : 0

  project      = var.project_id
  subscription = google_pubsub_subscription.dead_letter_sink.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${google_service_account.autoscaler.email}"
}

# Dead-lettering is done by the Pub/Sub service agent: it must be able to publish to the
# dead-letter topic and to acknowledge (subscriber) on the source subscription. Both grants go
# with the dead-letter policy: dead_letter_enabled = false is for organizations that forbid them.
resource "google_pubsub_topic_iam_member" "pubsub_agent_dead_letter_publisher" {
  count = var.dead_letter_enabled ? 1 : 0

  project = var.project_id
  topic   = google_pubsub_topic.dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${local.pubsub_service_agent}"

  depends_on = [google_project_service_identity.pubsub]
}

resource "google_pubsub_subscription_iam_member" "pubsub_agent_tasks_subscriber" {
  count = var.dead_letter_enabled ? 1 : 0

  project      = var.project_id
  subscription = google_pubsub_subscription.tasks.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${local.pubsub_service_agent}"

  depends_on = [google_project_service_identity.pubsub]
}

# The same two grants for the results subscription's dead-letter policy.
resource "google_pubsub_topic_iam_member" "pubsub_agent_results_dead_letter_publisher" {
  count = var.dead_letter_enabled ? 1 : 0

  project = var.project_id
  topic   = google_pubsub_topic.results_dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${local.pubsub_service_agent}"

  depends_on = [google_project_service_identity.pubsub]
}

resource "google_pubsub_subscription_iam_member" "pubsub_agent_results_subscriber" {
  count = var.dead_letter_enabled ? 1 : 0

  project      = var.project_id
  subscription = google_pubsub_subscription.results.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${local.pubsub_service_agent}"

  depends_on = [google_project_service_identity.pubsub]
}

# --- Firestore ---------------------------------------------------------------------------------
#
# Project level: Firestore has no per-database (or per-collection) IAM resource for data access;
# roles/datastore.* can only be granted on the project. An IAM condition on resource.name narrows
# each grant to this environment's database (var.firestore_iam_condition, on by default), so two
# environments in one project (two name_prefixes, two databases) cannot touch each other's
# documents. Nothing the components do needs a Firestore permission outside their database: they
# read and write documents of that one database (the dashboard's queries included), and list no
# databases, make no index and call no admin API. The (default) database is
# projects/<p>/databases/(default), as the condition writes it.

locals {
  firestore_writers = {
    split     = google_service_account.split.email
    aggregate = google_service_account.aggregate.email
    worker    = google_service_account.worker.email
    # `bucketlearn autoscale` reads active jobs' epochs (the backlog) and writes its own
    # control/autoscaler document (the time of its last change, for the cool-down); its
    # watchdog reads job, epoch and task documents and updates jobs (watchdog_at, or FAILED for a
    # split that never finished).
    autoscaler = google_service_account.autoscaler.email
    # The dashboard reads job, version and worker documents, and its "Cancel job" button writes
    # one job document (a conditional update to CANCELLED): datastore.viewer cannot write, and
    # there is no narrower predefined role than datastore.user that can.
    dashboard = google_service_account.dashboard.email
  }
}

resource "google_project_iam_member" "firestore_users" {
  for_each = local.firestore_writers

  project = var.project_id
  role    = "roles/datastore.user"
  member  = "serviceAccount:${each.value}"

  dynamic "condition" {
    for_each = var.firestore_iam_condition ? [local.firestore_database_resource] : []
    content {
      title       = "bucketlearn-firestore-only"
      description = "Only this environment's Firestore database"
      expression  = "resource.name == \"${condition.value}\""
    }
  }
}

# --- Eventarc storage trigger (the split function's; none on the deltas bucket) ----------------

# Project level: roles/eventarc.eventReceiver is only grantable on the project.
resource "google_project_iam_member" "eventarc_receiver" {
  project = var.project_id
  role    = "roles/eventarc.eventReceiver"
  member  = "serviceAccount:${google_service_account.eventarc.email}"
}

# The trigger delivers events by invoking the function's Cloud Run service: invoker on that
# service only (a 2nd-gen function's service has the function's name).
resource "google_cloud_run_v2_service_iam_member" "eventarc_invokes_split" {
  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.split.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.eventarc.email}"
}

# Project level: the Cloud Storage service agent publishes object notifications to topics that
# Eventarc creates and names itself, so there is no topic to scope this to.
resource "google_project_iam_member" "gcs_agent_pubsub_publisher" {
  project = var.project_id
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"
}

# Pub/Sub pushes the events with an OIDC token of the trigger account; projects whose Pub/Sub
# agent predates April 2021 need this grant explicitly. Scoped to that one account.
resource "google_service_account_iam_member" "pubsub_agent_token_creator" {
  service_account_id = google_service_account.eventarc.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = "serviceAccount:${local.pubsub_service_agent}"

  depends_on = [google_project_service_identity.pubsub, google_project_service_identity.eventarc]
}

# --- autoscaler --------------------------------------------------------------------------------

# Resize the two worker pools - these pools only. (roles/run.developer is the narrowest
# predefined role with run.workerpools.update; a custom role with just get+update would be
# narrower still.)
resource "google_cloud_run_v2_worker_pool_iam_member" "autoscaler_developer" {
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_worker_pool.learners.name
  role     = "roles/run.developer"
  member   = "serviceAccount:${google_service_account.autoscaler.email}"
}

resource "google_cloud_run_v2_worker_pool_iam_member" "autoscaler_aggregator_developer" {
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_worker_pool.aggregator.name
  role     = "roles/run.developer"
  member   = "serviceAccount:${google_service_account.autoscaler.email}"
}

# Updating a Cloud Run resource requires actAs on the identity it runs as: only the accounts
# of the two pools (learner, aggregator), not the project's.
resource "google_service_account_iam_member" "autoscaler_acts_as_worker" {
  service_account_id = google_service_account.worker.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.autoscaler.email}"
}

resource "google_service_account_iam_member" "autoscaler_acts_as_aggregator" {
  service_account_id = google_service_account.aggregate.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.autoscaler.email}"
}

# Cloud Scheduler may start the autoscaler job and nothing else (run.invoker carries
# run.jobs.run on this job).
resource "google_cloud_run_v2_job_iam_member" "scheduler_invoker" {
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_job.autoscaler.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.scheduler.email}"
}

# --- dashboard access --------------------------------------------------------------------------

# IAP: people need roles/iap.httpsResourceAccessor on this service; IAP itself (its service agent)
# is the only caller of the service.
resource "google_iap_web_cloud_run_service_iam_member" "dashboard_users" {
  for_each = local.dashboard_iap ? toset(var.dashboard_users) : toset([])

  project                = var.project_id
  location               = var.region
  cloud_run_service_name = google_cloud_run_v2_service.dashboard.name
  role                   = "roles/iap.httpsResourceAccessor"
  member                 = each.value
}

resource "google_cloud_run_v2_service_iam_member" "iap_invokes_dashboard" {
  count = local.dashboard_iap ? 1 : 0

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.dashboard.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${local.iap_service_agent}"

  depends_on = [google_project_service_identity.iap]
}

# Internal load balancer mode: the named people (through your load balancer) invoke directly.
resource "google_cloud_run_v2_service_iam_member" "dashboard_invokers" {
  for_each = local.dashboard_iap ? toset([]) : toset(var.dashboard_users)

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.dashboard.name
  role     = "roles/run.invoker"
  member   = each.value
}
