#!/usr/bin/env bash
# Deploy bucketlearn to a Google Cloud project (the infra/examples/dev environment).
#
#   infra/deploy.sh --project my-project [--region europe-west1] [--yes]
#
# Steps: package the functions (infra/package-functions.sh) -> terraform init -> create the APIs
# and the Artifact Registry repository (-target) -> build and push the worker and dashboard images
# (Cloud Build, or local docker with --builder docker) -> terraform apply everything with the
# images pinned by digest -> print the dashboard URL and how to start a job.
#
# Works with bash 3.2 (macOS) and later.
# Needs: gcloud (logged in: `gcloud auth login` and `gcloud auth application-default login`),
# terraform >= 1.5, python3; docker only with --builder docker. The account needs to create
# everything in the module (Owner on a dev project, or the roles listed in infra/README.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="$ROOT/infra/examples/dev"
BUILD_DIR="$ROOT/infra/.build"
TFVARS="$ENV_DIR/deploy.auto.tfvars.json"

PROJECT="${BUCKETLEARN_PROJECT:-${GOOGLE_CLOUD_PROJECT:-}}"
REGION="${BUCKETLEARN_REGION:-europe-west1}"
NAME_PREFIX="${BUCKETLEARN_NAME_PREFIX:-bucketlearn}"
REPOSITORY="bucketlearn" # module default artifact_repository_id
BUILDER="cloudbuild"
TAG=""
AUTO_APPROVE=()
DASHBOARD_USERS=()

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
  cat <<'EOF'
Options:
  --project ID             Google Cloud project (or BUCKETLEARN_PROJECT / GOOGLE_CLOUD_PROJECT)
  --region REGION          region (default europe-west1, or BUCKETLEARN_REGION)
  --prefix NAME            resource name prefix (default bucketlearn)
  --tag TAG                image tag (default: git commit, plus -dirty-<time> for a dirty tree)
  --builder cloudbuild|docker
                           where images are built (default cloudbuild)
  --dashboard-user MEMBER  principal allowed to open the dashboard (repeatable; default: the
                           active gcloud account)
  --yes                    do not ask before terraform apply
EOF
}

die() {
  echo "deploy: $*" >&2
  exit 1
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --project) PROJECT="${2:?--project needs a value}"; shift 2 ;;
    --region) REGION="${2:?--region needs a value}"; shift 2 ;;
    --prefix) NAME_PREFIX="${2:?--prefix needs a value}"; shift 2 ;;
    --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
    --builder) BUILDER="${2:?--builder needs a value}"; shift 2 ;;
    --dashboard-user) DASHBOARD_USERS+=("${2:?--dashboard-user needs a value}"); shift 2 ;;
    --yes | -y) AUTO_APPROVE=(-auto-approve); shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

[[ -n "$PROJECT" ]] || die "no project: pass --project or set BUCKETLEARN_PROJECT"
[[ "$BUILDER" == "cloudbuild" || "$BUILDER" == "docker" ]] || die "--builder must be cloudbuild or docker"
for tool in gcloud terraform python3; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (see infra/README.md)"
done
if [[ "$BUILDER" == "docker" ]]; then
  command -v docker >/dev/null 2>&1 || die "docker is not installed; use --builder cloudbuild"
fi

if [[ -z "$TAG" ]]; then
  if TAG="$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null)"; then
    if [[ -n "$(git -C "$ROOT" status --porcelain -- bucketlearn workers dashboard functions pyproject.toml 2>/dev/null)" ]]; then
      TAG="$TAG-dirty-$(date -u +%Y%m%d%H%M%S)"
    fi
  else
    TAG="build-$(date -u +%Y%m%d%H%M%S)"
  fi
fi

if [[ ${#DASHBOARD_USERS[@]} -eq 0 ]]; then
  account="$(gcloud config get-value account 2>/dev/null || true)"
  if [[ -n "$account" ]]; then
    if [[ "$account" == *.gserviceaccount.com ]]; then
      DASHBOARD_USERS=("serviceAccount:$account")
    else
      DASHBOARD_USERS=("user:$account")
    fi
  fi
fi

IMAGE_BASE="$REGION-docker.pkg.dev/$PROJECT/$REPOSITORY"
WORKER_IMAGE="$IMAGE_BASE/worker:$TAG"
DASHBOARD_IMAGE="$IMAGE_BASE/dashboard:$TAG"
FUNCTION_ZIP="$BUILD_DIR/functions.zip"

# The variables of this deploy, read by every terraform command below and by teardown.sh.
write_tfvars() {
  python3 - "$TFVARS" "$PROJECT" "$REGION" "$NAME_PREFIX" "$1" "$2" "$FUNCTION_ZIP" ${DASHBOARD_USERS[@]+"${DASHBOARD_USERS[@]}"} <<'PY'
import json
import sys

path, project, region, prefix, worker, dashboard, zip_path, *users = sys.argv[1:]
with open(path, "w") as handle:
    json.dump({
        "project_id": project,
        "region": region,
        "name_prefix": prefix,
        "worker_image": worker,
        "dashboard_image": dashboard,
        "function_source_zip": zip_path,
        "dashboard_users": users,
    }, handle, indent=2)
    handle.write("\n")
PY
}

tf() {
  terraform -chdir="$ENV_DIR" "$@"
}

echo "==> project $PROJECT, region $REGION, images tagged $TAG"

echo "==> packaging the functions"
"$ROOT/infra/package-functions.sh" "$FUNCTION_ZIP"

write_tfvars "$WORKER_IMAGE" "$DASHBOARD_IMAGE"

# Terraform needs these two before it can read the project or enable anything else.
echo "==> enabling the Service Usage and Resource Manager APIs"
gcloud services enable serviceusage.googleapis.com cloudresourcemanager.googleapis.com --project "$PROJECT"

echo "==> terraform init"
tf init -input=false

echo "==> enabling APIs and creating the image repository"
tf apply -input=false ${AUTO_APPROVE[@]+"${AUTO_APPROVE[@]}"} \
  -target=module.bucketlearn.google_project_service.apis \
  -target=module.bucketlearn.google_artifact_registry_repository.images

echo "==> building images ($BUILDER)"
if [[ "$BUILDER" == "cloudbuild" ]]; then
  # The Cloud Build service account needs roles/artifactregistry.writer on the repository.
  (cd "$ROOT" && gcloud builds submit . \
    --project "$PROJECT" \
    --config infra/cloudbuild.yaml \
    --ignore-file infra/cloudbuild.gcloudignore \
    --substitutions "_WORKER_IMAGE=$WORKER_IMAGE,_DASHBOARD_IMAGE=$DASHBOARD_IMAGE")
else
  gcloud auth configure-docker "$REGION-docker.pkg.dev" --quiet
  docker build --file "$ROOT/workers/Dockerfile" --tag "$WORKER_IMAGE" "$ROOT"
  docker build --file "$ROOT/dashboard/Dockerfile" --tag "$DASHBOARD_IMAGE" "$ROOT"
  docker push "$WORKER_IMAGE"
  docker push "$DASHBOARD_IMAGE"
fi

# Deploy by digest: a re-pushed tag can then never change what runs.
digest_of() {
  local ref
  ref="$(gcloud artifacts docker images describe "$1" --project "$PROJECT" \
    --format='value(image_summary.fully_qualified_digest)' 2>/dev/null || true)"
  if [[ -n "$ref" ]]; then echo "$ref"; else echo "$1"; fi
}
WORKER_REF="$(digest_of "$WORKER_IMAGE")"
DASHBOARD_REF="$(digest_of "$DASHBOARD_IMAGE")"
write_tfvars "$WORKER_REF" "$DASHBOARD_REF"

echo "==> terraform apply"
tf apply -input=false ${AUTO_APPROVE[@]+"${AUTO_APPROVE[@]}"}

UPLOADS="$(tf output -raw uploads_bucket)"
MODELS="$(tf output -raw models_bucket)"
DASHBOARD_URL="$(tf output -raw dashboard_url)"

cat <<EOF

bucketlearn is deployed.

  Dashboard:  $DASHBOARD_URL
              (IAP: sign in as one of: ${DASHBOARD_USERS[*]+${DASHBOARD_USERS[*]}})

  Start a job:
    gcloud storage cp data/digits.csv gs://$UPLOADS/

  Follow it with the CLI against this deployment:
    eval "\$(terraform -chdir=infra/examples/dev output -json env_vars | python3 -c 'import json,shlex,sys; [print(f"export {k}={shlex.quote(v)}") for k,v in json.load(sys.stdin).items()]')"
    BUCKETLEARN_TARGET=cloud bucketlearn status

  Download the model when it is done:
    gcloud storage cp gs://$MODELS/models/<job-id>/latest.keras .

  Tear everything down:  infra/teardown.sh
EOF
