output "env_vars" {
  description = "Environment variables bucketlearn reads, as deployed (export them to use the CLI against this environment)."
  value       = module.bucketlearn.env_vars
}

output "uploads_bucket" {
  description = "Upload CSVs here to start jobs."
  value       = module.bucketlearn.uploads_bucket
}

output "models_bucket" {
  description = "Trained models: models/<job>/latest.keras."
  value       = module.bucketlearn.models_bucket
}

output "dashboard_url" {
  description = "Dashboard URL (sign in with an account listed in dashboard_users)."
  value       = module.bucketlearn.dashboard_url
}

output "artifact_registry" {
  description = "Docker repository for the images."
  value       = module.bucketlearn.artifact_registry
}

output "worker_pool" {
  description = "Learner worker pool resource name."
  value       = module.bucketlearn.worker_pool
}

output "aggregator_pool" {
  description = "Aggregator worker pool resource name."
  value       = module.bucketlearn.aggregator_pool
}

output "results_subscription" {
  description = "Subscription of \"result ready\" messages the aggregator pool reads."
  value       = module.bucketlearn.results_subscription
}

output "autoscaler_job" {
  description = "Cloud Run job running `bucketlearn autoscale` every minute (the watchdog, then the learner and aggregator pools' resize)."
  value       = module.bucketlearn.autoscaler_job
}

output "dead_letter_subscription" {
  description = "Subscription holding dead-lettered tasks; the controller job drains it every minute (acked messages are kept 7 days)."
  value       = module.bucketlearn.dead_letter_subscription
}

output "results_dead_letter_subscription" {
  description = "Subscription holding dead-lettered result messages, for an operator to inspect (no component consumes it)."
  value       = module.bucketlearn.results_dead_letter_subscription
}

output "build_service_account" {
  description = "Account Cloud Build runs as (the split function's build; infra/deploy.sh passes it to gcloud builds submit for the images)."
  value       = module.bucketlearn.build_service_account
}

output "firestore_database" {
  description = "Firestore database id of this environment."
  value       = module.bucketlearn.firestore_database
}
