terraform {
  # 1.5: `check` blocks and `import` blocks; nothing newer is used, so 1.5 through 1.x works.
  required_version = ">= 1.5, < 2.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.47 is the first 6.x release in which google_cloud_run_v2_worker_pool accepts
      # scaling.manual_instance_count = 0 (earlier 6.x dropped the zero, so a pool could not be
      # created scaled to zero). 7.x changed defaults (deletion_policy, labels) and is not tested.
      version = ">= 6.47, < 7.0"
    }
    google-beta = {
      source = "hashicorp/google-beta"
      # Used only for google_project_service_identity (beta-only): it makes Google create the
      # Pub/Sub, Eventarc and IAP service agents now, so that the IAM grants to them below do
      # not fail with "service account does not exist" on a fresh project.
      version = ">= 6.47, < 7.0"
    }
  }
}
