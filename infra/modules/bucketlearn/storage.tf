# Five buckets, all regional (the uploads bucket's Eventarc trigger must be in its region), all
# with uniform bucket-level access and public access prevention enforced. Access logging: usage
# logs are a legacy feature; Cloud Audit Logs (Data Access logs for storage.googleapis.com,
# enabled per project) are the supported way to audit object access, so no log bucket is made.
#
# Deltas (task results) have their own bucket, where nothing triggers: the aggregator pool
# learns of a result from the learner's message on the results topic, lists this bucket for a
# job's results, and the controller's watchdog lists it as its backstop (a lost message delays a
# round and loses nothing). Keeping results apart from the work bucket's shards keeps those
# listings short and lets the deltas expire after a day.

# CSV uploads. Versioned: a job is keyed by (bucket, name, generation) and the split reads its
# generation; re-uploading the same name must not delete a generation that is still being split.
resource "google_storage_bucket" "uploads" {
  #checkov:skip=CKV_GCP_62:Usage logs are legacy; object access is audited with Cloud Audit Logs (see the comment at the top of storage.tf).
  name                        = "${local.bucket_prefix}-uploads"
  project                     = var.project_id
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = !var.deletion_protection
  labels                      = merge(local.labels, { role = "uploads" })

  versioning {
    enabled = true
  }

  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      days_since_noncurrent_time = var.uploads_noncurrent_retention_days
      with_state                 = "ARCHIVED"
    }
  }

  lifecycle_rule {
    action {
      type = "AbortIncompleteMultipartUpload"
    }
    condition {
      age = 1
    }
  }

  depends_on = [google_project_service.apis]
}

# Shards, holdout and manifests: transient, rewritten idempotently by a re-delivered split, so
# neither versioning nor soft delete is wanted (both would only keep dead bytes around).
resource "google_storage_bucket" "work" {
  #checkov:skip=CKV_GCP_62:Usage logs are legacy; object access is audited with Cloud Audit Logs (see the comment at the top of storage.tf).
  #checkov:skip=CKV_GCP_78:Transient, re-creatable intermediate data deleted after work_retention_days; old versions would only cost storage.
  name                        = "${local.bucket_prefix}-work"
  project                     = var.project_id
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = !var.deletion_protection
  labels                      = merge(local.labels, { role = "work" })

  soft_delete_policy {
    retention_duration_seconds = 0
  }

  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      age = var.work_retention_days
    }
  }

  lifecycle_rule {
    action {
      type = "AbortIncompleteMultipartUpload"
    }
    condition {
      age = 1
    }
  }

  depends_on = [google_project_service.apis]
}

# Weight deltas (task results) and failure markers: write-once names (random nonce), consumed
# within minutes by the aggregator, which deletes what it applied; the lifecycle rule sweeps
# leftovers after deltas_retention_days. No notification or trigger on this bucket.
resource "google_storage_bucket" "deltas" {
  #checkov:skip=CKV_GCP_62:Usage logs are legacy; object access is audited with Cloud Audit Logs (see the comment at the top of storage.tf).
  #checkov:skip=CKV_GCP_78:Write-once transient objects (random nonce names) deleted within a day; versioning would keep every applied delta.
  name                        = "${local.bucket_prefix}-deltas"
  project                     = var.project_id
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = !var.deletion_protection
  labels                      = merge(local.labels, { role = "deltas" })

  soft_delete_policy {
    retention_duration_seconds = 0
  }

  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      age = var.deltas_retention_days
    }
  }

  lifecycle_rule {
    action {
      type = "AbortIncompleteMultipartUpload"
    }
    condition {
      age = 1
    }
  }

  depends_on = [google_project_service.apis]
}

# Versioned weights and exported models: the product. Versioned because latest.keras is
# overwritten on every export; noncurrent generations beyond models_noncurrent_versions go, and
# any noncurrent generation goes after models_noncurrent_retention_days: a deleted object (the
# weights of a finished job) has no newer generation, so the first rule alone never removes it.
resource "google_storage_bucket" "models" {
  #checkov:skip=CKV_GCP_62:Usage logs are legacy; object access is audited with Cloud Audit Logs (see the comment at the top of storage.tf).
  name                        = "${local.bucket_prefix}-models"
  project                     = var.project_id
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = !var.deletion_protection
  labels                      = merge(local.labels, { role = "models" })

  versioning {
    enabled = true
  }

  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      num_newer_versions = var.models_noncurrent_versions
      with_state         = "ARCHIVED"
    }
  }

  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      days_since_noncurrent_time = var.models_noncurrent_retention_days
      with_state                 = "ARCHIVED"
    }
  }

  # The parts of a batch prediction fanned out over the learners, composed into its output and
  # deleted within minutes; a part left behind (a learner died while deleting), and the
  # noncurrent copy a deleted part leaves in this versioned bucket, go a day after written.
  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      age            = 1
      matches_prefix = ["predictions/.parts/"]
      with_state     = "ANY"
    }
  }

  lifecycle_rule {
    action {
      type = "AbortIncompleteMultipartUpload"
    }
    condition {
      age = 1
    }
  }

  depends_on = [google_project_service.apis]
}

# Function source archives. The object name carries the archive's MD5, so a new archive is a
# new object (redeploying the split function) and Terraform deletes the previous one.
resource "google_storage_bucket" "sources" {
  #checkov:skip=CKV_GCP_62:Usage logs are legacy; object access is audited with Cloud Audit Logs (see the comment at the top of storage.tf).
  #checkov:skip=CKV_GCP_78:Archives are rebuilt from git by infra/deploy.sh; each has a content-addressed name, so versions add nothing.
  name                        = "${local.bucket_prefix}-sources"
  project                     = var.project_id
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = merge(local.labels, { role = "sources" })

  depends_on = [google_project_service.apis]
}

resource "google_storage_bucket_object" "functions_source" {
  name         = "functions/${filemd5(var.function_source_zip)}.zip"
  bucket       = google_storage_bucket.sources.name
  source       = var.function_source_zip
  content_type = "application/zip"
}
