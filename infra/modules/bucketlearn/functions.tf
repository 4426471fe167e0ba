# The split Cloud Function (2nd gen), triggered through Eventarc by objects finalized in the
# uploads bucket. Its source archive holds functions/main.py (the on_upload entry point) with
# bucketlearn/ vendored next to it. Results no longer go through a function: learners announce
# them on the results topic and a long-running aggregator pool folds them (pubsub.tf,
# workers.tf); an Eventarc trigger per result would add 1-3 s per round, plus cold starts.
#
# retry_policy = RETRY_POLICY_RETRY: Eventarc is at-least-once and, with retries on, re-delivers
# an event whose function raised (transient trouble or a crash mid-way); the core makes the
# handler idempotent (invariant 1) and returns normally for permanent failures (a rejected
# upload), so a bad file does not crash-loop. Events older than
# BUCKETLEARN_MAX_EVENT_AGE_SECONDS are dropped by the core.
#
# ingress ALLOW_INTERNAL_ONLY: only Eventarc (Pub/Sub push inside the project) reaches it; the
# only invoker is the trigger service account (iam.tf). No HTTP trigger, no public invoker.

# IAM is eventually consistent, and Eventarc grants its service agent its role only when the API
# is first enabled: on a fresh project, creating a storage-triggered function right after those
# grants fails ("Permission denied while using the Eventarc Service Agent", a known provider
# issue: hashicorp/terraform-provider-google#25294) and works on a rerun. So wait, once, after
# the grants the function and the builds need; again only if one of them is replaced.
resource "time_sleep" "iam_propagation" {
  create_duration = var.iam_propagation_wait

  triggers = merge(
    {
      eventarc_agent       = google_project_service_identity.eventarc.email
      pubsub_agent         = google_project_service_identity.pubsub.email
      gcs_agent_publisher  = google_project_iam_member.gcs_agent_pubsub_publisher.id
      eventarc_receiver    = google_project_iam_member.eventarc_receiver.id
      pubsub_token_creator = google_service_account_iam_member.pubsub_agent_token_creator.id
    },
    { for role, grant in google_project_iam_member.build : "build ${role}" => grant.id },
    { for grant in google_artifact_registry_repository_iam_member.build_writer : "build registry writer" => grant.id },
    { for grant in google_storage_bucket_iam_member.build_sources_viewer : "build sources viewer" => grant.id },
  )
}

resource "google_cloudfunctions2_function" "split" {
  name        = "${var.name_prefix}-split"
  project     = var.project_id
  location    = var.region
  description = "bucketlearn: split an uploaded CSV into shards, create the job, publish epoch-0 tasks"
  labels      = local.labels

  build_config {
    runtime         = var.function_runtime
    entry_point     = "on_upload"
    service_account = "projects/${var.project_id}/serviceAccounts/${local.build_service_account}"
    # The image goes to the module's repository, where the build account may write (iam.tf),
    # not to gcf-artifacts, which Cloud Functions makes itself and the account has no role on.
    docker_repository = google_artifact_registry_repository.images.id
    source {
      storage_source {
        bucket = google_storage_bucket.sources.name
        object = google_storage_bucket_object.functions_source.name
      }
    }
  }

  service_config {
    min_instance_count               = 0
    max_instance_count               = var.split_max_instances
    max_instance_request_concurrency = 1
    available_memory                 = var.function_memory
    available_cpu                    = var.function_cpu
    timeout_seconds                  = var.function_timeout_seconds
    environment_variables            = merge({ BUCKETLEARN_KEEP_PARSED_BYTES = local.keep_parsed_bytes }, local.runtime_env)
    ingress_settings                 = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision   = true
    service_account_email            = google_service_account.split.email
  }

  event_trigger {
    trigger_region        = var.region
    event_type            = "google.cloud.storage.object.v1.finalized"
    retry_policy          = "RETRY_POLICY_RETRY"
    service_account_email = google_service_account.eventarc.email
    event_filters {
      attribute = "bucket"
      value     = google_storage_bucket.uploads.name
    }
  }

  depends_on = [
    time_sleep.iam_propagation,
    google_project_iam_member.eventarc_receiver,
    google_project_iam_member.gcs_agent_pubsub_publisher,
    google_storage_bucket_iam_member.split,
    google_storage_bucket_iam_member.split_models_prefixes,
    google_pubsub_topic_iam_member.split_publisher,
    google_project_iam_member.firestore_users,
  ]

  lifecycle {
    precondition {
      condition     = local.function_memory_mib >= local.memory_mib_range_by_cpu[var.function_cpu][0] && local.function_memory_mib <= local.memory_mib_range_by_cpu[var.function_cpu][1]
      error_message = "function_memory does not fit function_cpu. Cloud Run (which runs 2nd gen functions) allows: 1 vCPU up to 4Gi, 2 vCPU up to 8Gi, 4 vCPU 2Gi-16Gi, 8 vCPU 4Gi-32Gi."
    }
  }
}
