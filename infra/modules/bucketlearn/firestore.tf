# Firestore (native mode): jobs, versions (the head pointer), task attempts, leases, heartbeats.
# Only server code touches it, through IAM (iam.tf); the security rules deny every client SDK.
# The database is local.firestore_database (main.tf): var.firestore_database, else one of this
# name_prefix's own, "<name_prefix>-db".

resource "google_firestore_database" "this" {
  count = var.create_firestore_database ? 1 : 0

  project     = var.project_id
  name        = local.firestore_database
  location_id = coalesce(var.firestore_location, var.region)
  type        = "FIRESTORE_NATIVE"

  app_engine_integration_mode       = "DISABLED"
  point_in_time_recovery_enablement = var.firestore_point_in_time_recovery ? "POINT_IN_TIME_RECOVERY_ENABLED" : "POINT_IN_TIME_RECOVERY_DISABLED"
  delete_protection_state           = var.deletion_protection ? "DELETE_PROTECTION_ENABLED" : "DELETE_PROTECTION_DISABLED"
  # ABANDON leaves the database (and its data) in place on `terraform destroy`.
  deletion_policy = var.deletion_protection ? "ABANDON" : "DELETE"

  depends_on = [google_project_service.apis]
}

# Security rules (infra/firestore.rules): deny all reads and writes from client SDKs. Server
# client libraries authenticate with IAM and bypass rules, so this closes the only other door.
resource "google_firebaserules_ruleset" "firestore" {
  count = var.firestore_rules == null ? 0 : 1

  project = var.project_id

  source {
    files {
      name    = "firestore.rules"
      content = var.firestore_rules
    }
  }

  lifecycle {
    create_before_destroy = true
  }

  depends_on = [google_project_service.apis, google_firestore_database.this]
}

resource "google_firebaserules_release" "firestore" {
  count = var.firestore_rules == null ? 0 : 1

  project      = var.project_id
  name         = local.firestore_database == "(default)" ? "cloud.firestore" : "cloud.firestore/${local.firestore_database}"
  ruleset_name = "projects/${var.project_id}/rulesets/${google_firebaserules_ruleset.firestore[0].name}"

  lifecycle {
    replace_triggered_by = [google_firebaserules_ruleset.firestore[0]]
  }
}

# Learners' heartbeat documents (collection "workers", one per learner process) would otherwise
# stay for ever: each carries expire_at (its last heartbeat + 1 day), and Firestore's TTL deletes a
# document some time after that (typically within a day). The empty index_config keeps no
# single-field index on expire_at: nothing queries it, and Firestore advises exempting a TTL
# timestamp from indexing (an index on an ever-increasing value is a write hotspot).
resource "google_firestore_field" "workers_expire_at" {
  project    = var.project_id
  database   = local.firestore_database
  collection = "workers"
  field      = "expire_at"

  ttl_config {}

  index_config {}

  depends_on = [google_project_service.apis, google_firestore_database.this]
}

# The autoscaler counts the parts of running batch predictions (collection "predictions" under
# each job) with one collection-group query on state == "RUNNING"
# (adapters/firestore.py: running_predictions). Firestore keeps single-field indexes at
# collection scope only by default; a collection-group query needs this one. Setting a field's
# indexes replaces its defaults, so the collection-scope one is kept here too. (A job's listing,
# list_predictions, orders its own collection on created_at: the default index serves it.)
resource "google_firestore_field" "predictions_state" {
  project    = var.project_id
  database   = local.firestore_database
  collection = "predictions"
  field      = "state"

  index_config {
    indexes {
      order       = "ASCENDING"
      query_scope = "COLLECTION_GROUP"
    }
    indexes {
      order       = "ASCENDING"
      query_scope = "COLLECTION"
    }
  }

  depends_on = [google_project_service.apis, google_firestore_database.this]
}
