"""infra/deploy.sh's checks, run against a fake ``gcloud`` and ``terraform`` on PATH.

The fakes answer the read-only calls the checks make (account, credentials, project, billing,
IAM policy, ancestors, enabled services, Firestore database) from environment variables and
log every call, so a test can show that a failed check stops the script before it creates
anything: no ``gcloud services enable``, no ``gcloud builds submit``, no ``terraform
init/apply``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.infra.provider_schema import Config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "infra" / "deploy.sh"

FAKE_GCLOUD = r"""#!/usr/bin/env bash
echo "gcloud $*" >> "$FAKE_LOG"
case "$*" in
  "config get-value account") echo "$FAKE_ACCOUNT" ;;
  "auth application-default print-access-token") [[ "$FAKE_ADC" == yes ]] && echo token || exit 1 ;;
  "projects describe "*) echo ACTIVE ;;
  "billing projects describe "*) echo "$FAKE_BILLING" ;;
  "projects get-iam-policy "*) printf '%s\n' $FAKE_POLICY ;;
  "projects get-ancestors "*) printf '%s\n' $FAKE_ANCESTORS ;;
  "services list "*) printf '%s\n' serviceusage.googleapis.com storage.googleapis.com ;;
  "firestore databases describe "*) [[ "$FAKE_FIRESTORE" == exists ]] || exit 1 ;;
  *) : ;;  # anything else (services enable, builds submit, ...) only logged
esac
"""

FAKE_TERRAFORM = r"""#!/usr/bin/env bash
echo "terraform $*" >> "$FAKE_LOG"
if [[ "$1" == version ]]; then echo '{"terraform_version": "1.11.4"}'; fi
"""

# Calls that create or change something: none may happen when a check fails.
MUTATING = re.compile(r"^gcloud (services enable|builds submit|auth configure-docker)|"
                      r"^terraform .*(init|apply|import)", re.M)


@pytest.fixture
def fakes(tmp_path: Path) -> dict[str, str]:
    """Environment that puts fake gcloud and terraform first on PATH (all checks passing)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("gcloud", FAKE_GCLOUD), ("terraform", FAKE_TERRAFORM)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE_LOG": str(tmp_path / "calls.log"),
        "FAKE_ACCOUNT": "ana@example.com",
        "FAKE_ADC": "yes",
        "FAKE_BILLING": "True",
        "FAKE_POLICY": "roles/owner,user:ana@example.com roles/viewer,user:bo@example.com",
        "FAKE_ANCESTORS": "project organization",
        "FAKE_FIRESTORE": "absent",
    }


def deploy(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    result = subprocess.run(
        [str(DEPLOY), "--project", "my-project-123", "--yes", *args],
        env=env, capture_output=True, text=True, timeout=120)
    log_path = Path(env["FAKE_LOG"])
    return result, log_path.read_text() if log_path.exists() else ""


def test_all_checks_pass_and_check_only_creates_nothing(fakes: dict[str, str]) -> None:
    result, calls = deploy(fakes, "--check-only")
    assert result.returncode == 0, result.stderr
    assert "all checks passed" in result.stdout
    assert "ok    billing: expected billingEnabled True; found True" in result.stdout
    assert "roles/owner" in result.stdout
    assert "gcloud billing projects describe my-project-123" in calls
    assert not MUTATING.search(calls), calls


def test_billing_disabled_stops_before_anything_is_created(fakes: dict[str, str]) -> None:
    result, calls = deploy({**fakes, "FAKE_BILLING": "False"})
    assert result.returncode == 1
    assert "FAIL  billing: expected billingEnabled True; found False" in result.stderr
    assert "gcloud billing projects link" in result.stderr
    assert "nothing was created" in result.stderr
    assert not MUTATING.search(calls), calls


def test_a_missing_role_stops_before_anything_is_created(fakes: dict[str, str]) -> None:
    policy = "roles/editor,user:ana@example.com roles/owner,user:someone.else@example.com"
    result, calls = deploy({**fakes, "FAKE_POLICY": policy})
    assert result.returncode == 1
    assert "FAIL  roles of user:ana@example.com" in result.stderr
    assert "found roles/editor" in result.stderr
    assert "roles/resourcemanager.projectIamAdmin" in result.stderr
    assert "--skip-role-check" in result.stderr
    assert not MUTATING.search(calls), calls
    # Every listed role, without Owner, is enough; and the check can be skipped.
    listed = re.search(r"REQUIRED_ROLES=\(\n(.*?)\n\)", DEPLOY.read_text(), re.S).group(1)
    policy = " ".join(f"{role.strip()},user:ana@example.com" for role in listed.splitlines())
    assert deploy({**fakes, "FAKE_POLICY": policy}, "--check-only")[0].returncode == 0
    assert deploy({**fakes, "FAKE_POLICY": ""}, "--check-only",
                  "--skip-role-check")[0].returncode == 0


def test_iap_without_an_organization_stops_and_says_what_to_do(fakes: dict[str, str]) -> None:
    result, calls = deploy({**fakes, "FAKE_ANCESTORS": "project"})
    assert result.returncode == 1
    assert "FAIL  organization: expected one above the project" in result.stderr
    assert "--dashboard-access internal_lb" in result.stderr
    assert not MUTATING.search(calls), calls
    result, _calls = deploy({**fakes, "FAKE_ANCESTORS": "project"}, "--check-only",
                            "--dashboard-access", "internal_lb")
    assert result.returncode == 0, result.stderr


def test_missing_login_or_credentials_stop_it(fakes: dict[str, str]) -> None:
    result, calls = deploy({**fakes, "FAKE_ADC": "no", "FAKE_ACCOUNT": ""})
    assert result.returncode == 1
    assert "gcloud auth login" in result.stderr
    assert "gcloud auth application-default login" in result.stderr
    assert not MUTATING.search(calls), calls


def test_an_existing_firestore_database_stops_it(fakes: dict[str, str]) -> None:
    result, calls = deploy({**fakes, "FAKE_FIRESTORE": "exists"})
    assert result.returncode == 1
    assert "FAIL  Firestore database (default)" in result.stderr
    assert "--prefix" in result.stderr and "terraform -chdir=infra/examples/dev import" in (
        result.stderr)
    assert not MUTATING.search(calls), calls


def test_a_second_prefix_gets_its_own_database_as_the_example_does(
        fakes: dict[str, str], tmp_path: Path) -> None:
    _result, calls = deploy(fakes, "--check-only", "--prefix", "dev2")
    assert "firestore databases describe --database=dev2-db " in calls
    _result, calls = deploy({**fakes, "FAKE_LOG": str(tmp_path / "default.log")}, "--check-only")
    assert "firestore databases describe --database=(default) " in calls
    # The example's own rule (local.firestore_database: "(default)" for the default prefix,
    # else null) and then the module's (local.firestore_database: the example's, else the
    # prefix's own), evaluated by terraform console.
    terraform = shutil.which("terraform", path=os.environ["PATH"])
    if terraform is None:
        pytest.skip("terraform is not installed; the example's rule was not evaluated")
    rules = []
    for directory in (ROOT / "infra" / "examples" / "dev",
                      ROOT / "infra" / "modules" / "bucketlearn"):
        (rule,) = [entry["firestore_database"] for _p, entry in Config(directory).top("locals")
                   if "firestore_database" in entry]
        rules.append(rule[2:-1] if rule.startswith("${") else rule)
    example_rule, module_rule = rules
    for prefix, expected in (("bucketlearn", "(default)"), ("dev2", "dev2-db")):
        given = example_rule.replace("var.firestore_database", "null")
        expression = module_rule.replace("var.firestore_database", f"({given})").replace(
            "var.name_prefix", f'"{prefix}"')
        answer = subprocess.run([terraform, "console"], input=expression + "\n", cwd=tmp_path,
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull})
        assert answer.stdout.strip() == f'"{expected}"', answer.stdout + answer.stderr


def test_a_bad_prefix_stops_it_before_any_call(fakes: dict[str, str]) -> None:
    result, calls = deploy(fakes, "--prefix", "Bad_Prefix")
    assert result.returncode == 1
    assert "--prefix must be" in result.stderr
    assert calls == ""


def test_deploy_lists_the_apis_the_module_enables() -> None:
    module = Config(ROOT / "infra" / "modules" / "bucketlearn")
    (apis,) = [entry["apis"] for _p, entry in module.top("locals") if "apis" in entry]
    module_apis = set(re.findall(r'"([a-z]+\.googleapis\.com)"', apis))
    listed = re.search(r"REQUIRED_APIS=\(\n(.*?)\n\)", DEPLOY.read_text(), re.S).group(1)
    deploy_apis = {line.strip() for line in listed.splitlines()}
    # iap is added by the script itself with --dashboard-access iap.
    assert deploy_apis | {"iap.googleapis.com"} == module_apis | {"serviceusage.googleapis.com"}


def test_readme_lists_the_roles_deploy_checks() -> None:
    readme = (ROOT / "infra" / "README.md").read_text()
    listed = re.search(r"REQUIRED_ROLES=\(\n(.*?)\n\)", DEPLOY.read_text(), re.S).group(1)
    missing = [r.strip() for r in listed.splitlines() if r.strip() not in readme]
    assert not missing, f"infra/README.md does not list {missing}"


def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    scripts = sorted(str(p) for p in [*(ROOT / "infra").glob("*.sh"),
                                      *(ROOT / "tests" / "infra").glob("*.sh")])
    result = subprocess.run([shellcheck, *scripts], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout
