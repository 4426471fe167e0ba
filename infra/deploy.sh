#!/usr/bin/env bash
# Deploy bucketlearn to a Google Cloud project (the infra/examples/dev environment).
#
#   infra/deploy.sh --project my-project [--region europe-west1] [--prefix bucketlearn] [--yes]
#   infra/deploy.sh --project my-project --check-only
#
# What it needs, checked with gcloud before anything is created (--check-only stops there):
#   * gcloud, terraform >= 1.5 and python3 (docker too with --builder docker);
#   * a gcloud login (`gcloud auth login`) and Application Default Credentials for Terraform
#     (`gcloud auth application-default login`);
#   * the project exists, is active, and has billing enabled;
#   * the deploying account holds roles/owner, or every role in REQUIRED_ROLES below, on the
#     project (this check reads the project's IAM policy: roles held through a group, a folder
#     or the organization do not show there; pass --skip-role-check if you hold them that way);
#   * with --dashboard-access iap (the default): the project belongs to an organization, which
#     IAP on Cloud Run requires; without one, pass --dashboard-access internal_lb and run the
#     dashboard on your machine (infra/README.md);
#   * no Firestore database of the name this environment uses exists outside this checkout's
#     Terraform state (a project has one "(default)" database; another --prefix gets its own).
# It enables serviceusage and cloudresourcemanager with gcloud, then Terraform enables the APIs
# in REQUIRED_APIS below.
#
# Steps: checks -> package the split function (infra/package-functions.sh) -> enable the
# Service Usage and Resource Manager APIs -> terraform init -> terraform apply -target: the APIs,
# the image repository, the build service account and its grants, and a one-off wait for IAM to
# propagate -> build and push the worker and dashboard images (Cloud Build, as the build service
# account; or local docker with --builder docker) -> terraform apply everything, images pinned by
# digest -> print the dashboard URL and how to start a job.
#
# Works with bash 3.2 (macOS) and later.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="$ROOT/infra/examples/dev"
BUILD_DIR="$ROOT/infra/.build"
TFVARS="$ENV_DIR/deploy.auto.tfvars.json"

# The APIs the module enables (modules/bucketlearn/main.tf, local.apis), plus Service Usage,
# which Terraform needs to enable the others. firebaserules is there because the example
# releases Firestore rules; iap only with --dashboard-access iap.
REQUIRED_APIS=(
  serviceusage.googleapis.com
  artifactregistry.googleapis.com
  cloudbuild.googleapis.com
  cloudfunctions.googleapis.com
  cloudresourcemanager.googleapis.com
  cloudscheduler.googleapis.com
  eventarc.googleapis.com
  firebaserules.googleapis.com
  firestore.googleapis.com
  iam.googleapis.com
  logging.googleapis.com
  monitoring.googleapis.com
  pubsub.googleapis.com
  run.googleapis.com
  storage.googleapis.com
)

# What the deploying account needs on the project if it is not an Owner (infra/README.md).
REQUIRED_ROLES=(
  roles/serviceusage.serviceUsageAdmin
  roles/storage.admin
  roles/pubsub.admin
  roles/datastore.owner
  roles/firebaserules.admin
  roles/cloudfunctions.admin
  roles/run.admin
  roles/eventarc.admin
  roles/cloudscheduler.admin
  roles/artifactregistry.admin
  roles/iam.serviceAccountAdmin
  roles/iam.serviceAccountUser
  roles/resourcemanager.projectIamAdmin
  roles/iap.admin
  roles/monitoring.alertPolicyEditor
  roles/cloudbuild.builds.editor
  roles/logging.viewer
)

PROJECT="${BUCKETLEARN_PROJECT:-${GOOGLE_CLOUD_PROJECT:-}}"
REGION="${BUCKETLEARN_REGION:-europe-west1}"
NAME_PREFIX="${BUCKETLEARN_NAME_PREFIX:-bucketlearn}"
DASHBOARD_ACCESS="iap"
BUILDER="cloudbuild"
TAG=""
CHECK_ONLY=0
SKIP_ROLE_CHECK=0
AUTO_APPROVE=()
DASHBOARD_USERS=()

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
  cat <<'EOF'
Options:
  --project ID             Google Cloud project (or BUCKETLEARN_PROJECT / GOOGLE_CLOUD_PROJECT)
  --region REGION          region (default europe-west1, or BUCKETLEARN_REGION)
  --prefix NAME            resource name prefix (default bucketlearn); another prefix is another
                           environment in the same project, with its own Firestore database
  --dashboard-access iap|internal_lb
                           iap (default) needs an organization; internal_lb has no public way in
  --tag TAG                image tag (default: git commit, plus -dirty-<time> for a dirty tree)
  --builder cloudbuild|docker
                           where images are built (default cloudbuild)
  --dashboard-user MEMBER  principal allowed to open the dashboard (repeatable; default: the
                           active gcloud account)
  --check-only             run the checks and stop
  --skip-role-check        do not check the deploying account's roles (held through a group,
                           folder or organization)
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
    --dashboard-access) DASHBOARD_ACCESS="${2:?--dashboard-access needs a value}"; shift 2 ;;
    --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
    --builder) BUILDER="${2:?--builder needs a value}"; shift 2 ;;
    --dashboard-user) DASHBOARD_USERS+=("${2:?--dashboard-user needs a value}"); shift 2 ;;
    --check-only) CHECK_ONLY=1; shift ;;
    --skip-role-check) SKIP_ROLE_CHECK=1; shift ;;
    --yes | -y) AUTO_APPROVE=(-auto-approve); shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

[[ -n "$PROJECT" ]] || die "no project: pass --project or set BUCKETLEARN_PROJECT"
[[ "$BUILDER" == "cloudbuild" || "$BUILDER" == "docker" ]] || die "--builder must be cloudbuild or docker"
[[ "$DASHBOARD_ACCESS" == "iap" || "$DASHBOARD_ACCESS" == "internal_lb" ]] ||
  die "--dashboard-access must be iap or internal_lb"
# The module's own validation rules, checked here so a typo stops before anything is created.
[[ "$NAME_PREFIX" =~ ^[a-z][a-z0-9-]{1,17}[a-z0-9]$ ]] ||
  die "--prefix must be 3-19 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen (found: $NAME_PREFIX)"
[[ "$REGION" =~ ^[a-z]+-[a-z]+[0-9]+$ ]] || die "--region must be a region such as europe-west1 (found: $REGION)"

# Same rule as local.firestore_database in infra/examples/dev/main.tf ("(default)" for the
# default prefix, else the module's own default, <prefix>-db).
if [[ "$NAME_PREFIX" == "bucketlearn" ]]; then
  FIRESTORE_DATABASE="(default)"
else
  FIRESTORE_DATABASE="$NAME_PREFIX-db"
fi
REPOSITORY="$NAME_PREFIX" # artifact_repository_id in infra/examples/dev/main.tf
BUILD_SERVICE_ACCOUNT="$NAME_PREFIX-build@$PROJECT.iam.gserviceaccount.com" # modules/bucketlearn/iam.tf

# --- checks: nothing below creates anything until they all pass --------------------------------

FAILED=0

# check NAME EXPECTED FOUND ok|fail [HINT]: one line saying what was expected and what was found.
check() {
  if [[ "$4" == "ok" ]]; then
    printf '  ok    %s: expected %s; found %s\n' "$1" "$2" "$3"
  else
    FAILED=$((FAILED + 1))
    printf '  FAIL  %s: expected %s; found %s\n' "$1" "$2" "$3" >&2
    if [[ -n "${5:-}" ]]; then printf '        %s\n' "$5" >&2; fi
  fi
}

run_checks() {
  local tool version account member found missing role state managed ancestors enabled api
  local apis=("${REQUIRED_APIS[@]}") apis_to_enable=()
  if [[ "$DASHBOARD_ACCESS" == "iap" ]]; then apis+=(iap.googleapis.com); fi

  echo "==> checking what the deploy needs (project $PROJECT, region $REGION, prefix $NAME_PREFIX)"
  echo "    APIs: ${apis[*]}"
  echo "    deploying account: roles/owner, or: ${REQUIRED_ROLES[*]}"
  echo "    billing enabled; with --dashboard-access iap, an organization above the project"

  for tool in gcloud terraform python3; do
    if command -v "$tool" >/dev/null 2>&1; then
      check "$tool" "installed" "$(command -v "$tool")" ok
    else
      check "$tool" "installed" "not on PATH" fail "install it (infra/README.md lists where from)"
    fi
  done
  if [[ "$BUILDER" == "docker" ]] && ! command -v docker >/dev/null 2>&1; then
    check "docker" "installed (--builder docker)" "not on PATH" fail "use --builder cloudbuild"
  fi
  if ! command -v gcloud >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1; then
    return
  fi
  if command -v terraform >/dev/null 2>&1; then
    version="$(terraform version -json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["terraform_version"])' 2>/dev/null || echo unknown)"
    if python3 -c 'import sys; v = tuple(int(p) for p in sys.argv[1].split(".")[:2]); sys.exit(not (1, 5) <= v < (2, 0))' "$version" 2>/dev/null; then
      check "terraform version" ">= 1.5, < 2.0" "$version" ok
    else
      check "terraform version" ">= 1.5, < 2.0" "$version" fail "https://developer.hashicorp.com/terraform/install"
    fi
  fi

  account="$(gcloud config get-value account 2>/dev/null || true)"
  if [[ -n "$account" ]]; then
    check "gcloud account" "a logged-in account" "$account" ok
  else
    check "gcloud account" "a logged-in account" "none" fail "run: gcloud auth login"
  fi
  if gcloud auth application-default print-access-token >/dev/null 2>&1; then
    check "application default credentials" "present (Terraform uses them)" "present" ok
  else
    check "application default credentials" "present (Terraform uses them)" "none" fail \
      "run: gcloud auth application-default login"
  fi

  state="$(gcloud projects describe "$PROJECT" --format='value(lifecycleState)' 2>/dev/null || true)"
  if [[ "$state" == "ACTIVE" ]]; then
    check "project $PROJECT" "ACTIVE" "$state" ok
  else
    check "project $PROJECT" "ACTIVE" "${state:-not found, or no permission to read it}" fail \
      "create it (gcloud projects create $PROJECT) or check the id and your access"
    return # the remaining checks all read the project
  fi

  found="$(gcloud billing projects describe "$PROJECT" --format='value(billingEnabled)' 2>/dev/null || true)"
  if [[ "$found" == "True" ]]; then
    check "billing" "billingEnabled True" "True" ok
  else
    check "billing" "billingEnabled True" "${found:-unreadable}" fail \
      "link a billing account: gcloud billing projects link $PROJECT --billing-account=ACCOUNT_ID (gcloud billing accounts list)"
  fi

  if [[ "$SKIP_ROLE_CHECK" == 1 ]]; then
    echo "  skip  roles of the deploying account (--skip-role-check)"
  elif [[ -n "$account" ]]; then
    if [[ "$account" == *.gserviceaccount.com ]]; then member="serviceAccount:$account"; else member="user:$account"; fi
    found="$(gcloud projects get-iam-policy "$PROJECT" --flatten='bindings[].members' \
      --format='csv[no-heading](bindings.role,bindings.members)' 2>/dev/null |
      awk -F, -v m="$member" '$2 == m { print $1 }' | sort -u | tr '\n' ' ' || true)"
    if [[ " $found " == *" roles/owner "* ]]; then
      check "roles of $member" "roles/owner or the list above" "roles/owner" ok
    else
      missing=""
      for role in "${REQUIRED_ROLES[@]}"; do
        [[ " $found " == *" $role "* ]] || missing="$missing $role"
      done
      if [[ -z "$missing" ]]; then
        check "roles of $member" "roles/owner or the list above" "all of the list" ok
      else
        check "roles of $member" "roles/owner or the list above" "${found:-no roles on the project}" fail \
          "missing:$missing (held through a group, folder or organization? rerun with --skip-role-check)"
      fi
    fi
  fi

  if [[ "$DASHBOARD_ACCESS" == "iap" ]]; then
    ancestors="$(gcloud projects get-ancestors "$PROJECT" --format='value(type)' 2>/dev/null | tr '\n' ' ' || true)"
    if [[ " $ancestors " == *" organization "* ]]; then
      check "organization" "one above the project (IAP on Cloud Run)" "${ancestors% }" ok
    else
      check "organization" "one above the project (IAP on Cloud Run)" "${ancestors:-no ancestors readable}" fail \
        "without an organization: --dashboard-access internal_lb, then run the dashboard locally (infra/README.md)"
    fi
  fi

  enabled="$(gcloud services list --enabled --project "$PROJECT" --format='value(config.name)' 2>/dev/null | tr '\n' ' ' || true)"
  for api in "${apis[@]}"; do
    [[ " $enabled " == *" $api "* ]] || apis_to_enable+=("$api")
  done
  echo "  info  APIs to enable: ${apis_to_enable[*]:-none}"

  if gcloud firestore databases describe --database="$FIRESTORE_DATABASE" --project "$PROJECT" \
    --format='value(name)' >/dev/null 2>&1; then
    managed=""
    if [[ -f "$ENV_DIR/terraform.tfstate" ]] && grep -q '"google_firestore_database"' "$ENV_DIR/terraform.tfstate"; then
      managed=1
    fi
    if [[ -n "$managed" ]]; then
      check "Firestore database $FIRESTORE_DATABASE" "absent, or in this state" "in this state" ok
    else
      check "Firestore database $FIRESTORE_DATABASE" "absent, or in this state" "exists, not created from here" fail \
        "deploy with --prefix NAME (its own database, NAME-db), or take it over: terraform -chdir=infra/examples/dev import 'module.bucketlearn.google_firestore_database.this[0]' projects/$PROJECT/databases/$FIRESTORE_DATABASE"
    fi
  else
    check "Firestore database $FIRESTORE_DATABASE" "absent, or in this state" "absent" ok
  fi
}

run_checks
if [[ "$FAILED" -gt 0 ]]; then
  die "$FAILED check(s) failed; nothing was created"
fi
if [[ "$CHECK_ONLY" == 1 ]]; then
  echo "deploy: all checks passed (--check-only: nothing was created)"
  exit 0
fi

# --- deploy ------------------------------------------------------------------------------------

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
  python3 - "$TFVARS" "$PROJECT" "$REGION" "$NAME_PREFIX" "$DASHBOARD_ACCESS" "$1" "$2" "$FUNCTION_ZIP" ${DASHBOARD_USERS[@]+"${DASHBOARD_USERS[@]}"} <<'PY'
import json
import sys

path, project, region, prefix, access, worker, dashboard, zip_path, *users = sys.argv[1:]
with open(path, "w") as handle:
    json.dump({
        "project_id": project,
        "region": region,
        "name_prefix": prefix,
        "dashboard_access": access,
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

echo "==> project $PROJECT, region $REGION, prefix $NAME_PREFIX, images tagged $TAG"

echo "==> packaging the split function"
"$ROOT/infra/package-functions.sh" "$FUNCTION_ZIP"

write_tfvars "$WORKER_IMAGE" "$DASHBOARD_IMAGE"

# Terraform needs these two before it can read the project or enable anything else.
echo "==> enabling the Service Usage and Resource Manager APIs"
gcloud services enable serviceusage.googleapis.com cloudresourcemanager.googleapis.com --project "$PROJECT"

echo "==> terraform init"
tf init -input=false

# What the image builds need: the APIs, the repository, and the build account with its roles
# (time_sleep.iam_propagation depends on every grant the builds and the function need and waits
# once for IAM to propagate).
echo "==> enabling APIs, creating the image repository and the build service account"
tf apply -input=false ${AUTO_APPROVE[@]+"${AUTO_APPROVE[@]}"} \
  -target=module.bucketlearn.google_project_service.apis \
  -target=module.bucketlearn.google_artifact_registry_repository.images \
  -target=module.bucketlearn.time_sleep.iam_propagation

echo "==> building images ($BUILDER)"
if [[ "$BUILDER" == "cloudbuild" ]]; then
  (cd "$ROOT" && gcloud builds submit . \
    --project "$PROJECT" \
    --config infra/cloudbuild.yaml \
    --ignore-file infra/cloudbuild.gcloudignore \
    --service-account "projects/$PROJECT/serviceAccounts/$BUILD_SERVICE_ACCOUNT" \
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

if [[ "$DASHBOARD_ACCESS" == "iap" ]]; then
  DASHBOARD_NOTE="(IAP: sign in as one of: ${DASHBOARD_USERS[*]+${DASHBOARD_USERS[*]}})"
else
  DASHBOARD_NOTE="(internal_lb: not reachable from the internet; run it locally, see infra/README.md)"
fi

cat <<EOF

bucketlearn is deployed.

  Dashboard:  $DASHBOARD_URL
              $DASHBOARD_NOTE

  Start a job:
    gcloud storage cp data/digits.csv gs://$UPLOADS/

  Follow it with the CLI against this deployment:
    eval "\$(terraform -chdir=infra/examples/dev output -json env_vars | python3 -c 'import json,shlex,sys; [print(f"export {k}={shlex.quote(v)}") for k,v in json.load(sys.stdin).items()]')"
    BUCKETLEARN_TARGET=cloud bucketlearn status

  Download the model when it is done:
    gcloud storage cp gs://$MODELS/models/<job-id>/latest.keras .

  Tear everything down:  infra/teardown.sh
EOF
