#!/usr/bin/env bash
# Destroy what infra/deploy.sh created (the infra/examples/dev environment).
#
#   infra/teardown.sh [--yes]
#
# Uses the variables of the last deploy (infra/examples/dev/deploy.auto.tfvars.json). The dev
# environment sets deletion_protection = false, so buckets (with their objects), the Firestore
# database, the worker pool, the services and the image repository are all deleted. Enabled
# APIs stay enabled. Afterwards, optionally remove what Google created on the side:
#   - function build images of deployments made before the split function's build pushed to
#     the image repository: gcloud artifacts repositories delete gcf-artifacts --location REGION
#   - function sources:      gcloud storage rm -r gs://gcf-v2-sources-PROJECT_NUMBER-REGION/PREFIX-split
#   - Cloud Build sources:   gcloud storage rm -r gs://PROJECT_cloudbuild/source
# Note: a deleted Firestore (default) database can be re-created right away, but its data is gone.
# Another environment in the same project (another --prefix): the project-level grant of
# roles/pubsub.publisher to the Cloud Storage service agent is the same in both, and destroying
# one removes it; run infra/deploy.sh (or terraform apply) for the one that remains.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="$ROOT/infra/examples/dev"
TFVARS="$ENV_DIR/deploy.auto.tfvars.json"
AUTO_APPROVE=()

die() {
  echo "teardown: $*" >&2
  exit 1
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --yes | -y) AUTO_APPROVE=(-auto-approve); shift ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1 (only --yes)" ;;
  esac
done

command -v terraform >/dev/null 2>&1 || die "terraform is not installed"
command -v python3 >/dev/null 2>&1 || die "python3 is not installed"
[[ -f "$TFVARS" ]] || die "no $TFVARS: nothing deployed from this checkout (or deploy.sh never got that far)"

# Terraform evaluates the whole configuration on destroy, including filemd5() of the source zip.
ZIP="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["function_source_zip"])' "$TFVARS")"
if [[ ! -f "$ZIP" ]]; then
  "$ROOT/infra/package-functions.sh" "$ZIP"
fi

terraform -chdir="$ENV_DIR" init -input=false
terraform -chdir="$ENV_DIR" destroy -input=false ${AUTO_APPROVE[@]+"${AUTO_APPROVE[@]}"}

rm -f "$TFVARS"
echo "teardown: done (if another environment remains in this project, re-apply it: see the top of this script)"
