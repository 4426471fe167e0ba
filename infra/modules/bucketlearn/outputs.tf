output "env_vars" {
  description = "The environment variables bucketlearn reads (bucketlearn.config.SETTINGS_ENV names plus the project), exactly as every deployed component gets them. `eval \"$(terraform output -json env_vars | jq -r 'to_entries[] | \"export \\(.key)=\\(.value)\"')\"` points the CLI at this deployment."
  value       = local.runtime_env
}

output "autoscaler_env_vars" {
  description = "The extra variables only the controller job (`bucketlearn autoscale`) gets: the learner and aggregator pools and their bounds, the watchdog's stall seconds and, with dead_letter_enabled, the dead-letter subscription it drains."
  value       = local.autoscaler_env
}

output "uploads_bucket" {
  description = "Bucket to upload CSVs to (gs://<this>/<name>.csv starts a job)."
  value       = google_storage_bucket.uploads.name
}

output "work_bucket" {
  description = "Bucket of shards, holdout and manifests."
  value       = google_storage_bucket.work.name
}

output "deltas_bucket" {
  description = "Bucket of weight deltas written by the workers."
  value       = google_storage_bucket.deltas.name
}

output "models_bucket" {
  description = "Bucket of versioned weights and exported models (models/<job>/latest.keras)."
  value       = google_storage_bucket.models.name
}

output "tasks_topic" {
  description = "Pub/Sub topic of training tasks."
  value       = google_pubsub_topic.tasks.name
}

output "tasks_subscription" {
  description = "Pull subscription the workers read."
  value       = google_pubsub_subscription.tasks.name
}

output "results_topic" {
  description = "Pub/Sub topic of \"result ready\" messages (learners) and nudges (the controller's watchdog)."
  value       = google_pubsub_topic.results.name
}

output "results_subscription" {
  description = "Pull subscription the aggregator pool reads (dead-lettered after 100 deliveries, with dead_letter_enabled)."
  value       = google_pubsub_subscription.results.name
}

output "results_dead_letter_subscription" {
  description = "Subscription holding dead-lettered result messages for an operator to inspect (no component consumes it; kept 7 days, acked ones too). The results themselves stay in the deltas bucket."
  value       = google_pubsub_subscription.results_dead_letter_sink.name
}

output "dead_letter_subscription" {
  description = "Subscription holding dead-lettered tasks; the controller job drains it every minute (acked messages are kept 7 days)."
  value       = google_pubsub_subscription.dead_letter_sink.name
}

output "firestore_database" {
  description = "Firestore database id (firestore_database, else \"<name_prefix>-db\")."
  value       = local.firestore_database
}

output "artifact_registry" {
  description = "Docker repository for the worker and dashboard images (REGION-docker.pkg.dev/PROJECT/REPO)."
  value       = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"
}

output "split_function" {
  description = "Name of the split (on_upload) function."
  value       = google_cloudfunctions2_function.split.name
}

output "worker_pool" {
  description = "Full resource name of the learner worker pool."
  value       = google_cloud_run_v2_worker_pool.learners.id
}

output "aggregator_pool" {
  description = "Full resource name of the aggregator worker pool."
  value       = google_cloud_run_v2_worker_pool.aggregator.id
}

output "autoscaler_job" {
  description = "Name of the Cloud Run job that runs `bucketlearn autoscale`."
  value       = google_cloud_run_v2_job.autoscaler.name
}

output "dashboard_url" {
  description = "Dashboard URL (behind IAP, or reachable only through your load balancer with dashboard_access = internal_lb)."
  value       = google_cloud_run_v2_service.dashboard.uri
}

output "service_accounts" {
  description = "Service account emails by component."
  value = {
    split      = google_service_account.split.email
    aggregate  = google_service_account.aggregate.email
    worker     = google_service_account.worker.email
    dashboard  = google_service_account.dashboard.email
    autoscaler = google_service_account.autoscaler.email
    scheduler  = google_service_account.scheduler.email
    eventarc   = google_service_account.eventarc.email
    build      = local.build_service_account
  }
}

output "build_service_account" {
  description = "Email of the account Cloud Build runs as (the split function's build; pass it to `gcloud builds submit --service-account` for the images, as infra/deploy.sh does)."
  value       = local.build_service_account
}
