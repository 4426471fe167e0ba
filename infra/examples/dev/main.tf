# A throw-away development environment: everything is destroyable (deletion_protection = false),
# workers scale to zero when idle. infra/deploy.sh drives it; see infra/README.md.

locals {
  # Several environments can share a project (name_prefix): each gets its own image repository
  # and its own Firestore database, the module's default "<prefix>-db". The default prefix keeps
  # "(default)" (a project has a single one, the database with the free quota), given
  # explicitly; infra/deploy.sh uses the same rule when it checks for an existing database.
  firestore_database = var.firestore_database != null ? var.firestore_database : (
    var.name_prefix == "bucketlearn" ? "(default)" : null
  )
}

module "bucketlearn" {
  source = "../../modules/bucketlearn"

  project_id  = var.project_id
  region      = var.region
  name_prefix = var.name_prefix
  labels      = { env = "dev" }

  artifact_repository_id = var.name_prefix
  firestore_database     = local.firestore_database

  deletion_protection = false

  worker_image        = var.worker_image
  dashboard_image     = var.dashboard_image
  function_source_zip = var.function_source_zip

  min_workers = var.min_workers
  max_workers = var.max_workers

  dashboard_access = var.dashboard_access
  dashboard_users  = var.dashboard_users

  firestore_rules = file("${path.module}/../../firestore.rules")
}
