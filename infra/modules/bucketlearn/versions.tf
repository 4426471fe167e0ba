terraform {
  # 1.5: `check` blocks and `import` blocks; nothing newer is used, so 1.5 through 1.x works.
  required_version = ">= 1.5, < 2.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.47 is the first 6.x release in which google_cloud_run_v2_worker_pool accepts
      # scaling.manual_instance_count = 0 (earlier 6.x dropped the zero, so a pool could not be
      # created scaled to zero). 7.x changed defaults (deletion_policy, labels) and is not tested.
      # tests/infra/test_provider_schema.py checks every resource against the schema of both
      # ends of this range (6.47.0 and 6.50.0, the last 6.x release).
      version = ">= 6.47, < 7.0"
    }
    google-beta = {
      source = "hashicorp/google-beta"
      # Used for two things the 6.x GA provider lacks: google_project_service_identity (it makes
      # Google create the Pub/Sub, Eventarc and IAP service agents now, so that the IAM grants
      # to them do not fail with "service account does not exist" on a fresh project), and the
      # dashboard's google_cloud_run_v2_service, for iap_enabled (GA only from 7.21).
      version = ">= 6.47, < 7.0"
    }
    time = {
      source = "hashicorp/time"
      # time_sleep (functions.tf): create_duration and triggers exist in every 0.9+ release.
      version = ">= 0.9, < 1.0"
    }
  }
}
