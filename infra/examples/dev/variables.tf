variable "project_id" {
  type        = string
  description = "Google Cloud project id to deploy into."
}

variable "region" {
  type        = string
  default     = "europe-west1"
  description = "Region for every regional resource."
}

variable "name_prefix" {
  type        = string
  default     = "bucketlearn"
  description = "Prefix of resource names, the image repository id and (unless it is the default) the Firestore database (<prefix>-db); change it to run a second environment in the same project."
}

variable "firestore_database" {
  type        = string
  default     = null
  description = "Firestore database id. null: \"(default)\" with the default name_prefix, the module's own \"<name_prefix>-db\" with any other."
}

variable "dashboard_access" {
  type        = string
  default     = "iap"
  description = "\"iap\": Identity-Aware Proxy on the dashboard service (the project must belong to an organization). \"internal_lb\": no IAP and no public way in; run the dashboard on your machine against the deployment (infra/README.md) or put your own load balancer in front. infra/deploy.sh --dashboard-access sets it."
}

variable "worker_image" {
  type        = string
  description = "Worker image reference (infra/deploy.sh builds and passes it)."
}

variable "dashboard_image" {
  type        = string
  description = "Dashboard image reference (infra/deploy.sh builds and passes it)."
}

variable "function_source_zip" {
  type        = string
  description = "Path of the functions source zip (infra/package-functions.sh builds it)."
}

variable "dashboard_users" {
  type        = list(string)
  default     = []
  description = "Principals allowed through IAP to the dashboard, e.g. [\"user:you@example.com\"]. infra/deploy.sh adds the gcloud account that deploys."
}

variable "min_workers" {
  type        = number
  default     = 0
  description = "Fewest learner workers (0 scales to zero when idle)."
}

variable "max_workers" {
  type        = number
  default     = 4
  description = "Most learner workers."
}
