# Streamlit dashboard on Cloud Run. Never public: there is no allUsers / allAuthenticatedUsers
# invoker anywhere in this module.
#
#   dashboard_access = "iap" (default): Identity-Aware Proxy is enabled on the service itself (no
#     load balancer needed). Google sign-in in the browser; only var.dashboard_users pass
#     (roles/iap.httpsResourceAccessor). IAP calls the service as its service agent, which is the
#     only run.invoker. Ingress stays "all" because IAP fronts the run.app URL.
#   dashboard_access = "internal_lb": ingress only from the VPC and Cloud Load Balancing; bring an
#     external HTTPS load balancer with a serverless NEG (and IAP on its backend service) to reach
#     it. var.dashboard_users get run.invoker for authenticated calls through that path.

locals {
  dashboard_iap = var.dashboard_access == "iap"
}

resource "google_cloud_run_v2_service" "dashboard" {
  # iap_enabled is in hashicorp/google-beta since 6.30 but in hashicorp/google only from 7.21
  # (tests/infra/test_provider_schema.py checks this against both providers' schema).
  provider = google-beta

  name                = "${var.name_prefix}-dashboard"
  project             = var.project_id
  location            = var.region
  description         = "bucketlearn dashboard (Streamlit)"
  labels              = local.labels
  launch_stage        = local.dashboard_iap ? var.worker_pool_launch_stage : null
  deletion_protection = var.deletion_protection

  ingress     = local.dashboard_iap ? "INGRESS_TRAFFIC_ALL" : "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"
  iap_enabled = local.dashboard_iap

  template {
    service_account                  = google_service_account.dashboard.email
    labels                           = local.labels
    max_instance_request_concurrency = 40
    # Streamlit keeps one websocket per browser tab; let it live for an hour and stick to one
    # instance so its session state is found again on reconnect.
    timeout          = "3600s"
    session_affinity = true

    scaling {
      min_instance_count = 0
      max_instance_count = var.dashboard_max_instances
    }

    containers {
      name  = "dashboard"
      image = var.dashboard_image

      ports {
        container_port = 8080
      }

      resources {
        limits = {
          cpu    = "1"
          memory = "1Gi"
        }
        cpu_idle          = true
        startup_cpu_boost = true
      }

      dynamic "env" {
        for_each = local.runtime_env
        content {
          name  = env.key
          value = env.value
        }
      }

      startup_probe {
        initial_delay_seconds = 2
        period_seconds        = 3
        timeout_seconds       = 2
        failure_threshold     = 20
        http_get {
          path = "/_stcore/health"
          port = 8080
        }
      }

      liveness_probe {
        period_seconds    = 30
        timeout_seconds   = 5
        failure_threshold = 3
        http_get {
          path = "/_stcore/health"
          port = 8080
        }
      }
    }
  }

  lifecycle {
    ignore_changes = [launch_stage, client, client_version]
  }

  depends_on = [
    google_project_service.apis,
    google_storage_bucket_iam_member.dashboard,
    google_project_iam_member.firestore_users,
    google_pubsub_topic_iam_member.dashboard_results_publisher,
  ]
}
