# Firestore (native mode): jobs, versions (the head pointer), task attempts, leases, heartbeats.
# Only server code touches it, through IAM (iam.tf); the security rules deny every client SDK.

resource "google_firestore_database" "this" {
  count = var.create_firestore_database ? 1 : 0

  project     = var.project_id
  name        = var.firestore_database
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
  name         = var.firestore_database == "(default)" ? "cloud.firestore" : "cloud.firestore/${var.firestore_database}"
  ruleset_name = "projects/${var.project_id}/rulesets/${google_firebaserules_ruleset.firestore[0].name}"

  lifecycle {
    replace_triggered_by = [google_firebaserules_ruleset.firestore[0]]
  }
}
