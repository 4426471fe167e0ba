# A throw-away development environment: everything is destroyable (deletion_protection = false),
# workers scale to zero when idle. infra/deploy.sh drives it; see infra/README.md.

module "bucketlearn" {
  source = "../../modules/bucketlearn"

  project_id  = var.project_id
  region      = var.region
  name_prefix = var.name_prefix
  labels      = { env = "dev" }

  deletion_protection = false

  worker_image        = var.worker_image
  dashboard_image     = var.dashboard_image
  function_source_zip = var.function_source_zip

  min_workers = var.min_workers
  max_workers = var.max_workers

  dashboard_access = "iap"
  dashboard_users  = var.dashboard_users

  firestore_rules = file("${path.module}/../../firestore.rules")
}
