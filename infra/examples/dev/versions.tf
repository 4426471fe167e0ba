terraform {
  required_version = ">= 1.5, < 2.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.47, < 7.0"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 6.47, < 7.0"
    }
    time = {
      source  = "hashicorp/time"
      version = ">= 0.9, < 1.0"
    }
  }

  # Local state by default (gitignored). For a shared environment use a bucket:
  #   terraform init -backend-config="bucket=<state-bucket>" -backend-config="prefix=bucketlearn/dev"
  # after changing this block to: backend "gcs" {}
}

# user_project_override + billing_project: every API call names this project as its quota
# project. Credentials from `gcloud auth application-default login` have none, and some APIs
# (Firebase Rules: the Firestore ruleset and release) refuse user credentials without one (403).
# The caller needs serviceusage.services.use on the project (Owner and Service Usage Admin or
# Consumer have it).
provider "google" {
  project               = var.project_id
  region                = var.region
  user_project_override = true
  billing_project       = var.project_id
}

provider "google-beta" {
  project               = var.project_id
  region                = var.region
  user_project_override = true
  billing_project       = var.project_id
}
