"""Static checks of the Terraform in infra/ and of the Dockerfiles (no cloud, no provider).

``terraform validate`` needs the Google provider, which cannot be downloaded here, so these tests
check what can be checked offline:

* ``terraform fmt -check -recursive infra`` (skipped if terraform is not installed);
* the structure of every ``.tf`` file, parsed with python-hcl2 (skipped if not installed): the
  environment the code reads (``bucketlearn.config``) reaches every component (the watchdog's
  settings the controller job alone), Pub/Sub dead-lettering and the sink's one consumer, the
  results topic that feeds the aggregator pool (dead-lettered to a sink of its own, which no
  component consumes), the split function's Eventarc filter and no trigger on the deltas
  bucket, the models bucket's lifecycle, the TTL of worker heartbeats, one Firestore database
  per environment by default, least-privilege IAM (the controller's, the aggregator's and the
  learners' grant by grant; the IAM conditions of the build account's and the Firestore grants,
  evaluated with `terraform console`), no public members;
* the Dockerfiles (pinned base image, non-root user);
* checkov over infra/ (skipped unless checkov is installed, see tests/infra/install_checkov.sh).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.config import LIMITS_ENV, ONE_THREAD_BLAS, SETTINGS_ENV, load_autoscaler_settings

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MODULE = INFRA / "modules" / "bucketlearn"
EXAMPLE = INFRA / "examples" / "dev"
DOCKERFILES = {
    "worker": (ROOT / "workers" / "Dockerfile", ["python", "workers/main.py"]),
    "dashboard": (ROOT / "dashboard" / "Dockerfile",
                  ["streamlit", "run", "dashboard/app.py", "--server.port=8080",
                   "--server.address=0.0.0.0"]),
}

PROJECT_ENV = {"GOOGLE_CLOUD_PROJECT", "BUCKETLEARN_PROJECT"}
# Read only by the watchdog, which runs in the controller job (`bucketlearn autoscale`): that job
# gets them on top of env_vars, and no other component does (the dead-letter sink has one
# consumer).
CONTROLLER_ENV = {"BUCKETLEARN_STALL_SECONDS", "BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION"}
# The results topic and the aggregator pool (an aggregator process fed over Pub/Sub instead of
# an aggregate function triggered by the deltas bucket): the names the infra sets, which the
# Python side of that change reads (results in SETTINGS_ENV, the pool in the autoscaler's
# settings). Listed here so the infra can land first; once bucketlearn.config has them, adding
# them changes nothing, and test_the_code_reads_the_results_and_aggregator_names_the_infra_sets
# fails if the code names them differently.
RESULTS_ENV = {"BUCKETLEARN_RESULTS_TOPIC", "BUCKETLEARN_RESULTS_SUBSCRIPTION"}
AGGREGATOR_POOL_ENV = {"BUCKETLEARN_AGGREGATOR_POOL", "BUCKETLEARN_MIN_AGGREGATORS",
                       "BUCKETLEARN_MAX_AGGREGATORS"}
# `bucketlearn autoscale`'s own settings (bucketlearn.config.load_autoscaler_settings).
AUTOSCALER_CODE_ENV = set(re.findall(r'"(BUCKETLEARN_[A-Z0-9_]+)"',
                                     inspect.getsource(load_autoscaler_settings)))
AUTOSCALER_ENV = AUTOSCALER_CODE_ENV | AGGREGATOR_POOL_ENV
# Settings whose default suits the cloud: given through var.extra_env when needed.
OPTIONAL_ENV = {"BUCKETLEARN_LEASE_SECONDS", "BUCKETLEARN_MAX_EVENT_AGE_SECONDS",
                "BUCKETLEARN_EVAL_MAX_ROWS", "BUCKETLEARN_WORKER_MAX_MODELS",
                "BUCKETLEARN_AGGREGATOR_LEASE_SECONDS", "BUCKETLEARN_CHAIN_GRACE_SECONDS",
                "BUCKETLEARN_EVAL_FLUSH_SECONDS", "BUCKETLEARN_EVAL_CPU_SHARE",
                "BUCKETLEARN_WORKER_CACHE_BYTES",
                "BUCKETLEARN_CALL_LOG", "BUCKETLEARN_AGGREGATE_BUDGET_SECONDS"}
# The settings a deployed component cannot do without: where the data and the queue are.
CLOUD_ENV = ({key for key, (field, _kind) in SETTINGS_ENV.items()
              if field.endswith(("_bucket", "_topic", "_subscription", "_database"))}
             | RESULTS_ENV) - CONTROLLER_ENV
FORBIDDEN_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}
PUBSUB_IAM = ("google_pubsub_topic_iam_member", "google_pubsub_subscription_iam_member")


def tf_files() -> list[Path]:
    return sorted(p for p in INFRA.rglob("*.tf") if ".terraform" not in p.parts)


# --- terraform fmt -----------------------------------------------------------------------------

def test_terraform_fmt() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed (https://developer.hashicorp.com/terraform/install)"
                    "; `terraform fmt -check -recursive infra` not run")
    result = subprocess.run([terraform, "fmt", "-check", "-recursive", "-diff", "infra"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"terraform fmt found unformatted files:\n{result.stdout}"


# --- parsing -----------------------------------------------------------------------------------

def _unquote(text: str) -> str:
    inner = text[1:-1]
    if len(text) >= 2 and text[0] == text[-1] == '"' and '"' not in inner.replace('\\"', ""):
        return inner
    return text


def _norm(node: Any) -> Any:
    """python-hcl2 output without its bookkeeping keys and with literal strings unquoted
    (python-hcl2 >= 7 keeps the quotes of labels and string literals)."""
    if isinstance(node, dict):
        return {_unquote(k): _norm(v) for k, v in node.items() if not k.startswith("__")}
    if isinstance(node, list):
        return [_norm(v) for v in node]
    if isinstance(node, str):
        return _unquote(node)
    return node


class Config:
    """One Terraform directory (module or root), parsed."""

    def __init__(self, directory: Path) -> None:
        hcl2 = pytest.importorskip(
            "hcl2", reason="python-hcl2 is not installed (pip install python-hcl2); "
                           "structural Terraform checks not run")
        self.files: dict[str, dict[str, Any]] = {}
        for path in sorted(directory.glob("*.tf")):
            with path.open() as handle:
                self.files[path.name] = _norm(hcl2.load(handle))

    def blocks(self, kind: str) -> Iterator[Any]:
        for parsed in self.files.values():
            yield from parsed.get(kind, [])

    def resources(self, rtype: str | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
        for entry in self.blocks("resource"):
            for type_name, named in entry.items():
                for name, body in named.items():
                    if rtype is None or type_name == rtype:
                        yield type_name, name, body

    def resource(self, rtype: str, name: str) -> dict[str, Any]:
        for _type_name, rname, body in self.resources(rtype):
            if rname == name:
                return body
        raise AssertionError(f"no resource {rtype}.{name}")

    @property
    def locals(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for block in self.blocks("locals"):
            merged.update(block)
        return merged

    @property
    def variables(self) -> dict[str, dict[str, Any]]:
        return {name: body for entry in self.blocks("variable") for name, body in entry.items()}

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return {name: body for entry in self.blocks("output") for name, body in entry.items()}

    def expand(self, value: Any, seen: frozenset[str] = frozenset()) -> str:
        """The text of ``value`` with every local it references expanded, recursively: enough
        to find every role, member or bucket an expression can produce."""
        text = json.dumps(value) if not isinstance(value, str) else value
        parts = [text]
        for ref in sorted(set(re.findall(r"local\.(\w+)", text)) - seen):
            if ref in self.locals:
                parts.append(self.expand(self.locals[ref], seen | {ref}))
        return "\n".join(parts)

    def env_names(self, value: Any, seen: frozenset[str] = frozenset()) -> set[str]:
        """Environment variable names an env map expression yields (literal map keys, also
        inside merge() and conditionals, through local references)."""
        return set(self.env_definitions(value, seen))

    def env_definitions(self, value: Any, seen: frozenset[str] = frozenset()) -> dict[str, str]:
        """Each environment variable name an env map expression yields -> the text of the
        expression (a map, a local) that sets it, to see what its value is and under which
        condition."""
        if isinstance(value, dict):
            return {name: json.dumps({name: setting}) for name, setting in value.items()}
        text = str(value)
        found = {name: text for name in re.findall(r"\b([A-Z][A-Z0-9_]*)\s*=(?!=)", text)}
        for ref in sorted(set(re.findall(r"local\.(\w+)", text)) - seen):
            if ref in self.locals:
                found.update(self.env_definitions(self.locals[ref], seen | {ref}))
        return found


@pytest.fixture(scope="module")
def module() -> Config:
    return Config(MODULE)


@pytest.fixture(scope="module")
def example() -> Config:
    return Config(EXAMPLE)


def dynamic_blocks(body: Any, label: str) -> list[dict[str, Any]]:
    """Every ``dynamic "<label>"`` block anywhere inside ``body``."""
    found: list[dict[str, Any]] = []
    if isinstance(body, dict):
        for key, value in body.items():
            if key == "dynamic":
                for entry in value:
                    if label in entry:
                        found.append(entry[label])
            else:
                found.extend(dynamic_blocks(value, label))
    elif isinstance(body, list):
        for item in body:
            found.extend(dynamic_blocks(item, label))
    return found


def has_block(body: dict[str, Any], name: str) -> bool:
    return name in body or bool(dynamic_blocks({"dynamic": body.get("dynamic", [])}, name))


# --- layout and hygiene ------------------------------------------------------------------------

def test_expected_files_exist() -> None:
    for path in [
        MODULE / "versions.tf", MODULE / "variables.tf", MODULE / "outputs.tf",
        EXAMPLE / "main.tf", EXAMPLE / "variables.tf", EXAMPLE / "outputs.tf",
        EXAMPLE / "terraform.tfvars.example", INFRA / "firestore.rules",
        ROOT / "functions" / "requirements.txt", ROOT / ".dockerignore",
    ]:
        assert path.is_file(), f"missing {path.relative_to(ROOT)}"
    for script in ("deploy.sh", "teardown.sh", "package-functions.sh"):
        path = INFRA / script
        text = path.read_text()
        assert os.access(path, os.X_OK), f"infra/{script} is not executable"
        assert text.startswith("#!/usr/bin/env bash"), f"infra/{script} is not a bash script"
        assert "set -euo pipefail" in text, f"infra/{script} lacks set -euo pipefail"


def test_provider_versions_are_pinned(module: Config, example: Config) -> None:
    for config in (module, example):
        (terraform,) = list(config.blocks("terraform"))
        assert ">= 1.5" in terraform["required_version"]
        providers = terraform["required_providers"][0] if isinstance(
            terraform["required_providers"], list) else terraform["required_providers"]
        for name in ("google", "google-beta"):
            version = providers[name]["version"]
            assert re.search(r">=\s*6\.\d+", version) and "< 7.0" in version, (name, version)


def test_example_bills_every_call_to_the_project(example: Config) -> None:
    # ADC from `gcloud auth application-default login` has no quota project, and Firebase
    # Rules refuses user credentials without one: the providers must name the project.
    providers = {name: body for entry in example.blocks("provider")
                 for name, body in entry.items()}
    assert set(providers) == {"google", "google-beta"}
    for name, body in providers.items():
        assert body.get("user_project_override") is True, name
        assert body.get("billing_project") == "${var.project_id}", name


# Resource types that create a named object, and the argument holding the name.
NAMED = {"google_storage_bucket": "name", "google_pubsub_topic": "name",
         "google_pubsub_subscription": "name", "google_cloudfunctions2_function": "name",
         "google_cloud_run_v2_service": "name", "google_cloud_run_v2_job": "name",
         "google_cloud_run_v2_worker_pool": "name", "google_cloud_scheduler_job": "name",
         "google_service_account": "account_id", "google_monitoring_alert_policy": "display_name",
         "google_artifact_registry_repository": "repository_id",
         "google_firestore_database": "name"}


def test_a_second_prefix_is_a_separate_environment(module: Config, example: Config) -> None:
    # Every named object follows name_prefix, directly or through a variable the example
    # derives from it; otherwise a second environment in the project fails ALREADY_EXISTS.
    (call,) = [body for entry in example.blocks("module") for body in entry.values()]
    from_prefix = {"artifact_repository_id": "${var.name_prefix}",
                   "firestore_database": "${local.firestore_database}"}
    for variable, value in from_prefix.items():
        assert call.get(variable) == value, variable
    assert "var.name_prefix" in example.locals["firestore_database"]
    seen = set()
    for rtype, name, body in module.resources():
        if rtype in NAMED:
            seen.add(rtype)
            text = module.expand(body[NAMED[rtype]])
            assert "var.name_prefix" in text or any(f"var.{v}" in text for v in from_prefix), (
                f"{rtype}.{name}: {body[NAMED[rtype]]} does not follow name_prefix")
    assert seen == set(NAMED)


def test_every_variable_is_typed_and_described(module: Config, example: Config) -> None:
    for config in (module, example):
        for name, body in config.variables.items():
            assert "type" in body, f"variable {name} has no type"
            assert str(body.get("description", "")).strip(), f"variable {name} has no description"


def test_checkov_skips_have_reasons() -> None:
    for path in tf_files():
        for line in path.read_text().splitlines():
            match = re.search(r"#\s*checkov:skip=([A-Z_0-9]+)(?::(.*))?", line)
            if match:
                assert match.group(2) and len(match.group(2).strip()) >= 20, (
                    f"{path.relative_to(ROOT)}: checkov skip {match.group(1)} without a reason")


# --- environment -------------------------------------------------------------------------------

def test_cloud_env_names_are_the_ones_the_code_reads() -> None:
    assert CLOUD_ENV == {
        "BUCKETLEARN_UPLOADS_BUCKET", "BUCKETLEARN_WORK_BUCKET", "BUCKETLEARN_DELTAS_BUCKET",
        "BUCKETLEARN_MODELS_BUCKET", "BUCKETLEARN_TASKS_TOPIC", "BUCKETLEARN_TASKS_SUBSCRIPTION",
        "BUCKETLEARN_RESULTS_TOPIC", "BUCKETLEARN_RESULTS_SUBSCRIPTION",
        "BUCKETLEARN_FIRESTORE_DATABASE"}
    assert CONTROLLER_ENV <= set(SETTINGS_ENV)
    assert {"BUCKETLEARN_WORKER_POOL", "BUCKETLEARN_MIN_WORKERS",
            "BUCKETLEARN_MAX_WORKERS"} <= AUTOSCALER_CODE_ENV


def test_the_code_reads_the_results_and_aggregator_names_the_infra_sets() -> None:
    # Until bucketlearn.config reads them, RESULTS_ENV and AGGREGATOR_POOL_ENV stand in for the
    # code; a results or aggregator-pool setting it reads under another name must fail here
    # rather than go unset in the cloud.
    results_in_code = {key for key, (field, _kind) in SETTINGS_ENV.items()
                       if field.startswith("results_")}
    assert results_in_code <= RESULTS_ENV, results_in_code - RESULTS_ENV
    pool_in_code = {key for key in AUTOSCALER_CODE_ENV if "AGGREGATOR" in key}
    assert pool_in_code <= AGGREGATOR_POOL_ENV, pool_in_code - AGGREGATOR_POOL_ENV


def controller_env(module: Config) -> dict[str, str]:
    """The controller job's environment: name -> the expression that sets it."""
    job = module.resource("google_cloud_run_v2_job", "autoscaler")
    (block,) = dynamic_blocks(job, "env")
    return module.env_definitions(block["for_each"])


def test_every_setting_the_code_reads_is_set_or_optional(module: Config) -> None:
    # A setting bucketlearn.config gains must reach the component that reads it, or be a
    # documented optional one (extra_env): the watchdog's settings were once forgotten.
    given = set(module.locals["app_env"]) | set(controller_env(module))
    missing = set(SETTINGS_ENV) - given - OPTIONAL_ENV
    assert not missing, f"settings no component is given: {missing}"
    described = module.variables["extra_env"]["description"]
    for name in OPTIONAL_ENV:
        assert name in described, f"extra_env's description does not name {name}"
    for name in re.findall(r"BUCKETLEARN_[A-Z0-9_]+", described):
        assert name in set(SETTINGS_ENV) | set(LIMITS_ENV) | AUTOSCALER_ENV or (
            name.startswith("BUCKETLEARN_DEFAULT_")), f"extra_env names unknown setting {name}"


def test_controller_env_runs_the_watchdog(module: Config) -> None:
    env = controller_env(module)
    names = set(env)
    known = (set(SETTINGS_ENV) | set(LIMITS_ENV) | PROJECT_ENV | AUTOSCALER_ENV | RESULTS_ENV
             | set(ONE_THREAD_BLAS))
    assert names <= known, f"env names bucketlearn.config does not read: {names - known}"
    needed = CLOUD_ENV | PROJECT_ENV | CONTROLLER_ENV | AGGREGATOR_POOL_ENV | {
        "BUCKETLEARN_WORKER_POOL", "BUCKETLEARN_MIN_WORKERS", "BUCKETLEARN_MAX_WORKERS"}
    assert needed <= names, f"the controller job lacks {needed - names}"
    # The sink's short name, as the tasks subscription is passed, and only with dead-lettering.
    dead_letter = env["BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION"]
    assert re.search(r"BUCKETLEARN_DEAD_LETTER_SUBSCRIPTION\s*=\s*"
                     r"google_pubsub_subscription\.dead_letter_sink\.name\b", dead_letter)
    assert re.search(r"var\.dead_letter_enabled\s*\?", dead_letter), dead_letter
    assert module.locals["app_env"]["BUCKETLEARN_TASKS_SUBSCRIPTION"] == (
        "${google_pubsub_subscription.tasks.name}")
    assert re.search(r"BUCKETLEARN_STALL_SECONDS\s*=\s*tostring\(var\.stall_seconds\)",
                     env["BUCKETLEARN_STALL_SECONDS"])
    stall = module.variables["stall_seconds"]
    assert stall["type"] == "${number}" or stall["type"] == "number", stall["type"]
    assert stall["default"] == 600
    assert "validation" in stall
    preconditions = [c["condition"] for lifecycle in module.resource(
        "google_cloud_run_v2_job", "autoscaler").get("lifecycle", [])
        for c in lifecycle.get("precondition", [])]
    assert any("var.stall_seconds > var.ack_deadline_seconds" in c for c in preconditions)
    # Every deployed name is in one of the two outputs.
    outputs = module.outputs
    assert module.env_names(outputs["autoscaler_env_vars"]["value"]) | module.env_names(
        outputs["env_vars"]["value"]) >= names


def test_only_the_controller_reads_the_watchdog_settings(module: Config) -> None:
    # The sink has one consumer: a component (or a CLI fed env_vars) that got the dead-letter
    # subscription would drain it too.
    assert not module.env_names(module.outputs["env_vars"]["value"]) & CONTROLLER_ENV
    function = module.resource("google_cloudfunctions2_function", "split")
    env = module.env_names(function["service_config"][0]["environment_variables"])
    assert not env & CONTROLLER_ENV, f"the split function gets {env & CONTROLLER_ENV}"
    for rtype, name in [("google_cloud_run_v2_worker_pool", "learners"),
                        ("google_cloud_run_v2_worker_pool", "aggregator"),
                        ("google_cloud_run_v2_service", "dashboard")]:
        (block,) = dynamic_blocks(module.resource(rtype, name), "env")
        env = module.env_names(block["for_each"])
        assert not env & CONTROLLER_ENV, f"{rtype}.{name} gets {env & CONTROLLER_ENV}"


def test_extra_env_cannot_shadow_what_the_module_sets(module: Config) -> None:
    condition = module.variables["extra_env"]["validation"][0]["condition"]
    reserved = set(re.findall(r'"(BUCKETLEARN_[A-Z0-9_]+)"', condition))
    module_sets = {name for name in set(module.locals["app_env"]) | set(controller_env(module))
                   if name.startswith("BUCKETLEARN_")}
    assert module_sets <= reserved, f"extra_env may set {module_sets - reserved}"


def test_app_env_has_exactly_known_names(module: Config) -> None:
    app_env = module.locals["app_env"]
    names = set(app_env)
    known = set(SETTINGS_ENV) | set(LIMITS_ENV) | PROJECT_ENV | RESULTS_ENV | set(ONE_THREAD_BLAS)
    assert names <= known, f"env names bucketlearn.config does not read: {names - known}"
    assert CLOUD_ENV | PROJECT_ENV <= names, f"missing: {(CLOUD_ENV | PROJECT_ENV) - names}"
    assert app_env["BUCKETLEARN_LOG_FORMAT"] == "json"
    assert {k: app_env.get(k) for k in ONE_THREAD_BLAS} == dict(ONE_THREAD_BLAS)
    assert module.env_names(module.outputs["env_vars"]["value"]) == names


def test_every_component_gets_the_cloud_env(module: Config) -> None:
    needed = CLOUD_ENV | PROJECT_ENV
    function = module.resource("google_cloudfunctions2_function", "split")
    env = module.env_names(function["service_config"][0]["environment_variables"])
    assert needed <= env, f"the split function lacks {needed - env}"
    for rtype, name in [("google_cloud_run_v2_worker_pool", "learners"),
                        ("google_cloud_run_v2_worker_pool", "aggregator"),
                        ("google_cloud_run_v2_job", "autoscaler"),
                        ("google_cloud_run_v2_service", "dashboard")]:
        blocks = dynamic_blocks(module.resource(rtype, name), "env")
        assert len(blocks) == 1, f"{rtype}.{name} should set its env with one dynamic block"
        env = module.env_names(blocks[0]["for_each"])
        assert needed <= env, f"{rtype}.{name} lacks {needed - env}"


def test_every_component_is_told_the_results_topic_and_subscription(module: Config) -> None:
    # Learners publish "result ready" to the topic, the aggregator pulls the subscription, the
    # watchdog publishes nudges; all read them from the one app environment, as the tasks.
    app_env = module.locals["app_env"]
    assert app_env["BUCKETLEARN_RESULTS_TOPIC"] == "${google_pubsub_topic.results.name}"
    assert app_env["BUCKETLEARN_RESULTS_SUBSCRIPTION"] == (
        "${google_pubsub_subscription.results.name}")
    assert module.locals["runtime_env"] == "${merge(var.extra_env, local.app_env)}"
    assert RESULTS_ENV <= module.env_names(module.outputs["env_vars"]["value"])
    for rtype, name in [("google_cloud_run_v2_worker_pool", "learners"),
                        ("google_cloud_run_v2_worker_pool", "aggregator"),
                        ("google_cloud_run_v2_job", "autoscaler")]:
        (block,) = dynamic_blocks(module.resource(rtype, name), "env")
        assert RESULTS_ENV <= module.env_names(block["for_each"]), f"{rtype}.{name}"


def test_subscription_ack_deadline_matches_the_app(module: Config) -> None:
    subscription = module.resource("google_pubsub_subscription", "tasks")
    assert subscription["ack_deadline_seconds"] == "${var.ack_deadline_seconds}"
    assert module.variables["ack_deadline_seconds"]["default"] == 60
    assert "var.ack_deadline_seconds" in module.locals["app_env"][
        "BUCKETLEARN_ACK_DEADLINE_SECONDS"]


# --- Pub/Sub -----------------------------------------------------------------------------------

DEAD_LETTER_SINKS = {"dead_letter_sink", "results_dead_letter_sink"}


def test_every_subscription_but_the_sinks_dead_letters(module: Config) -> None:
    """The tasks after max_delivery_attempts (the app gives up earlier), the results after
    Pub/Sub's maximum of 100 (a message for a job another aggregator holds is handed back and
    redelivered, each time a delivery); the two sinks are the end of the line."""
    subscriptions = list(module.resources("google_pubsub_subscription"))
    assert {name for _t, name, _b in subscriptions} == {"tasks", "results"} | DEAD_LETTER_SINKS
    attempts = {"tasks": "var.max_delivery_attempts",
                "results": "local.results_max_delivery_attempts"}
    for _type, name, body in subscriptions:
        if name in DEAD_LETTER_SINKS:
            assert not has_block(body, "dead_letter_policy"), f"sink {name} dead-letters"
            assert "dead_letter_policy" not in json.dumps(body), name
            continue
        assert has_block(body, "dead_letter_policy"), f"subscription {name}: no dead_letter_policy"
        assert "retry_policy" in body, f"subscription {name} has no retry_policy"
        (dlq,) = dynamic_blocks(body, "dead_letter_policy")
        assert attempts[name] in dlq["for_each"] + json.dumps(dlq["content"]), name
    assert module.variables["max_delivery_attempts"]["default"] == 10
    assert module.locals["results_max_delivery_attempts"] == 100
    assert module.variables["dead_letter_enabled"]["default"] is True


def test_results_topic_feeds_the_aggregator_and_dead_letters_to_its_own_sink(
        module: Config) -> None:
    """The aggregator acks what it cannot take; a message that crashes it is dead-lettered after
    100 deliveries (Pub/Sub's maximum) to a topic of its own, whose sink keeps it 7 days (acked
    ones too) for an operator. Nothing is lost: the result is an object in the deltas bucket."""
    topic = module.resource("google_pubsub_topic", "results")
    assert topic["name"] == "${local.results_topic_name}"
    assert module.locals["results_topic_name"] == "${var.name_prefix}-results"
    results = module.resource("google_pubsub_subscription", "results")
    tasks = module.resource("google_pubsub_subscription", "tasks")
    assert results["name"] == "${local.results_subscription_name}"
    assert module.locals["results_subscription_name"] == "${var.name_prefix}-results-aggregator"
    assert results["topic"] == "${google_pubsub_topic.results.id}"
    # Dead-lettered with the tasks' switch, to the results' own topic, after 100 deliveries.
    (policy,) = dynamic_blocks(results, "dead_letter_policy")
    assert re.fullmatch(r"\$\{var\.dead_letter_enabled \? \[local\.results_max_delivery_attempts\]"
                        r" : \[\]\}", policy["for_each"]), policy["for_each"]
    (content,) = policy["content"]
    assert content == {"dead_letter_topic": "${google_pubsub_topic.results_dead_letter.id}",
                       "max_delivery_attempts": "${dead_letter_policy.value}"}
    assert module.locals["results_max_delivery_attempts"] == 100
    dead_letter = module.resource("google_pubsub_topic", "results_dead_letter")
    assert dead_letter["name"] == "${var.name_prefix}-results-dead-letter"
    assert dead_letter["name"] != module.resource("google_pubsub_topic", "dead_letter")["name"]
    # Its sink keeps every dead letter for the longest Pub/Sub allows, acked or not.
    sink = module.resource("google_pubsub_subscription", "results_dead_letter_sink")
    assert sink["name"] == "${var.name_prefix}-results-dead-letter-sink"
    assert sink["topic"] == "${google_pubsub_topic.results_dead_letter.id}"
    assert _seconds(sink["message_retention_duration"]) == 7 * 24 * 3600
    assert sink["retain_acked_messages"] is True
    assert sink["expiration_policy"][0]["ttl"] == ""
    for kind in ("push_config", "bigquery_config", "cloud_storage_config"):
        assert kind not in sink, kind
    on_topic = [name for _t, name, body in module.resources("google_pubsub_subscription")
                if "google_pubsub_topic.results_dead_letter." in body["topic"]]
    assert on_topic == ["results_dead_letter_sink"]
    # No component consumes it: no grant on it, no setting names it (the watchdog drains only
    # the tasks' sink); an operator reads it with their own access.
    assert not [name for _t, name, body in module.resources(
        "google_pubsub_subscription_iam_member") if "results_dead_letter" in body["subscription"]]
    for local in ("app_env", "autoscaler_env", "dead_letter_drain_env"):
        assert "results_dead_letter" not in module.expand(module.locals[local]), local
    assert module.outputs["results_dead_letter_subscription"]["value"] == (
        "${google_pubsub_subscription.results_dead_letter_sink.name}")
    # A pull subscription (the aggregator's streaming pull), never expiring, retaining and
    # leasing like the tasks one.
    for kind in ("push_config", "bigquery_config", "cloud_storage_config"):
        assert kind not in results, kind
    assert results["expiration_policy"][0]["ttl"] == ""
    for key in ("ack_deadline_seconds", "message_retention_duration"):
        assert results[key] == tasks[key], key
    assert results["ack_deadline_seconds"] == "${var.ack_deadline_seconds}"
    assert results.get("retain_acked_messages", False) is False
    # The aggregator's is the only subscription on the topic.
    on_topic = [name for _t, name, body in module.resources("google_pubsub_subscription")
                if "google_pubsub_topic.results." in body["topic"]]
    assert on_topic == ["results"]


def test_results_dead_letters_raise_an_alert(module: Config) -> None:
    alert = module.resource("google_monitoring_alert_policy", "results_dead_letters")
    assert alert["display_name"] == "${var.name_prefix}: results dead-lettered"
    assert alert["notification_channels"] == "${var.alert_notification_channels}"
    filters = [c["condition_threshold"][0]["filter"] for c in alert["conditions"]]
    assert any("subscription/dead_letter_message_count" in f
               and "google_pubsub_subscription.results.name" in f for f in filters), filters
    documentation = alert["documentation"][0]["content"]
    assert "google_pubsub_subscription.results_dead_letter_sink.name" in documentation


def test_results_subscription_has_one_consumer(module: Config) -> None:
    # The Pub/Sub service agent's subscriber grant only lets it forward a dead letter
    # (test_pubsub_service_agent_can_dead_letter); no other account pulls results.
    members = [body["member"] for _t, _n, body in module.resources(
        "google_pubsub_subscription_iam_member") if "subscription.results." in body["subscription"]
        and "local.pubsub_service_agent" not in body["member"]]
    assert members == ["serviceAccount:${google_service_account.aggregate.email}"]
    publishers = {body["member"] for _t, _n, body in module.resources(
        "google_pubsub_topic_iam_member") if "topic.results." in body["topic"]}
    assert publishers == {"serviceAccount:${google_service_account.worker.email}",
                          "serviceAccount:${google_service_account.autoscaler.email}",
                          # it announces a task it gave up on after refused results
                          "serviceAccount:${google_service_account.aggregate.email}",
                          # a nudge after "Cancel job", so the cancelled job's last version is
                          # exported
                          "serviceAccount:${google_service_account.dashboard.email}"}
    # The dashboard publishes and nothing more on Pub/Sub, and starts after that grant.
    assert {(rtype, role, target) for rtype, role, target in grants_to(module, "dashboard")
            if rtype in PUBSUB_IAM} == {("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
                                         "${google_pubsub_topic.results.name}")}
    dashboard = module.resource("google_cloud_run_v2_service", "dashboard")
    assert ("${google_pubsub_topic_iam_member.dashboard_results_publisher}"
            in dashboard["depends_on"])


def _seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, f"{duration!r} is not a literal duration in seconds"
    return int(match.group(1))


def test_dead_letter_sink_outlives_a_stopped_controller(module: Config) -> None:
    # The controller drains the sink every minute; the sink must keep what it has not drained
    # (a paused scheduler, a broken image) for days, whatever the tasks subscription keeps
    # (var.message_retention_duration may be 10 minutes).
    sink = module.resource("google_pubsub_subscription", "dead_letter_sink")
    assert _seconds(sink["message_retention_duration"]) >= 24 * 3600
    assert sink["ack_deadline_seconds"] >= 60
    assert sink["expiration_policy"][0]["ttl"] == ""
    # A pull subscription, the only one on the dead-letter topic.
    assert "push_config" not in sink and "bigquery_config" not in sink
    assert "cloud_storage_config" not in sink
    on_topic = [name for _t, name, body in module.resources("google_pubsub_subscription")
                if "google_pubsub_topic.dead_letter." in body["topic"]]
    assert on_topic == ["dead_letter_sink"]


def test_dead_letter_alert_sees_drained_messages(module: Config) -> None:
    # num_undelivered_messages of the sink stays 0 when the controller drains it within a
    # minute: the alert must count what Pub/Sub forwards from the tasks subscription.
    alert = module.resource("google_monitoring_alert_policy", "dead_letters")
    filters = [c["condition_threshold"][0]["filter"] for c in alert["conditions"]]
    assert any("subscription/dead_letter_message_count" in f
               and "google_pubsub_subscription.tasks.name" in f for f in filters), filters


def test_pubsub_service_agent_can_dead_letter(module: Config) -> None:
    agent = module.locals["pubsub_service_agent"]
    assert re.fullmatch(
        r"service-\$\{local\.project_number\}@gcp-sa-pubsub\.iam\.gserviceaccount\.com", agent)
    grants = {(rtype, body["role"], body.get("topic") or body.get("subscription"))
              for rtype, _name, body in module.resources()
              if rtype in PUBSUB_IAM and "local.pubsub_service_agent" in body["member"]}
    assert ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
            "${google_pubsub_topic.dead_letter.name}") in grants
    assert ("google_pubsub_subscription_iam_member", "roles/pubsub.subscriber",
            "${google_pubsub_subscription.tasks.name}") in grants
    # The same pair for the results' dead letters, and nothing else.
    assert ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
            "${google_pubsub_topic.results_dead_letter.name}") in grants
    assert ("google_pubsub_subscription_iam_member", "roles/pubsub.subscriber",
            "${google_pubsub_subscription.results.name}") in grants
    assert len(grants) == 4, grants


def test_dead_letter_grants_follow_the_switch(module: Config) -> None:
    # dead_letter_enabled = false exists for organizations that forbid these grants: with it
    # off, neither the policies nor the service agent's grants may be created.
    for rtype, name in [("google_pubsub_topic_iam_member", "pubsub_agent_dead_letter_publisher"),
                        ("google_pubsub_subscription_iam_member",
                         "pubsub_agent_tasks_subscriber"),
                        ("google_pubsub_topic_iam_member",
                         "pubsub_agent_results_dead_letter_publisher"),
                        ("google_pubsub_subscription_iam_member",
                         "pubsub_agent_results_subscriber")]:
        grant = module.resource(rtype, name)
        assert grant.get("count") == "${var.dead_letter_enabled ? 1 : 0}", (rtype, name)
        assert "${google_project_service_identity.pubsub}" in grant["depends_on"], name
    for subscription in ("tasks", "results"):
        (policy,) = dynamic_blocks(module.resource("google_pubsub_subscription", subscription),
                                   "dead_letter_policy")
        assert "var.dead_letter_enabled ?" in policy["for_each"], subscription


# --- functions ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "entry_point", "bucket"), [
    ("split", "on_upload", "uploads"),
])
def test_function_triggers(module: Config, name: str, entry_point: str, bucket: str) -> None:
    function = module.resource("google_cloudfunctions2_function", name)
    build = function["build_config"][0]
    assert build["entry_point"] == entry_point
    assert build["runtime"] == "${var.function_runtime}"
    assert "google_storage_bucket_object.functions_source" in json.dumps(build["source"])
    trigger = function["event_trigger"][0]
    assert trigger["event_type"] == "google.cloud.storage.object.v1.finalized"
    assert trigger["retry_policy"] == "RETRY_POLICY_RETRY"
    (event_filter,) = trigger["event_filters"]
    assert event_filter["attribute"] == "bucket"
    assert event_filter["value"] == f"${{google_storage_bucket.{bucket}.name}}"
    service = function["service_config"][0]
    assert service["timeout_seconds"] == "${var.function_timeout_seconds}"
    assert service["ingress_settings"] == "ALLOW_INTERNAL_ONLY"
    assert f"google_service_account.{name}." in service["service_account_email"]
    assert build["service_account"] == (
        "projects/${var.project_id}/serviceAccounts/${local.build_service_account}")
    assert "${time_sleep.iam_propagation}" in function["depends_on"]
    assert module.variables["function_runtime"]["default"] == "python311"
    assert module.variables["function_timeout_seconds"]["default"] == 540
    assert module.variables["function_memory"]["default"] == "2Gi"


def test_nothing_triggers_on_the_deltas_bucket(module: Config) -> None:
    """Results reach the aggregator as Pub/Sub messages, not as Eventarc events (1-3 s each):
    the split function is the only function, no trigger or notification watches the deltas
    bucket, and nothing of the aggregate function (trigger, invoker grant, variable, output) is
    left."""
    functions = {name: body for _t, name, body in module.resources(
        "google_cloudfunctions2_function")}
    assert set(functions) == {"split"}
    for name, body in functions.items():
        assert "google_storage_bucket.deltas." not in json.dumps(body.get("event_trigger")), name
    for rtype in ("google_eventarc_trigger", "google_storage_notification",
                  "google_cloudfunctions_function"):
        assert not list(module.resources(rtype)), f"a {rtype} is back"
    # Eventarc may invoke the split function's service and nothing else.
    invokers = [body["name"] for _t, _n, body in module.resources(
        "google_cloud_run_v2_service_iam_member")
        if "google_service_account.eventarc." in body["member"]]
    assert invokers == ["${google_cloudfunctions2_function.split.name}"]
    assert "aggregate_max_instances" not in module.variables
    assert "aggregate_function" not in module.outputs
    for path in tf_files():
        text = path.read_text()
        assert "cloudfunctions2_function.aggregate" not in text, path
        assert "on_delta" not in text, path


# --- aggregator --------------------------------------------------------------------------------

def test_aggregator_pool_runs_the_aggregator_as_its_own_account(module: Config) -> None:
    pool = module.resource("google_cloud_run_v2_worker_pool", "aggregator")
    learners = module.resource("google_cloud_run_v2_worker_pool", "learners")
    assert pool["name"] == "${local.aggregator_pool_name}"
    assert module.locals["aggregator_pool_name"] == "${var.name_prefix}-aggregator"
    (template,) = pool["template"]
    assert template["service_account"] == "${google_service_account.aggregate.email}"
    (container,) = template["containers"]
    assert container["image"] == "${var.worker_image}"
    assert container["command"] == ["bucketlearn"] and container["args"] == ["aggregator"]
    assert container["resources"][0]["limits"] == {"cpu": "${var.aggregator_cpu}",
                                                   "memory": "${var.aggregator_memory}"}
    (env,) = dynamic_blocks(pool, "env")
    assert env["for_each"] == "${local.runtime_env}"
    # The learners' pattern: manual scaling from the lower bound, then the autoscaler owns it.
    assert pool["scaling"][0]["manual_instance_count"] == "${var.min_aggregators}"
    for key in ("launch_stage", "deletion_protection", "location", "project"):
        assert pool[key] == learners[key], key
    assert pool["lifecycle"][0]["ignore_changes"] == learners["lifecycle"][0]["ignore_changes"]
    preconditions = [c["condition"] for c in pool["lifecycle"][0]["precondition"]]
    assert any("var.min_aggregators <= var.max_aggregators" in c for c in preconditions)
    # It starts after the grants it uses.
    for grant in ("google_storage_bucket_iam_member.aggregate",
                  "google_pubsub_subscription_iam_member.aggregator_results_subscriber",
                  "google_pubsub_topic_iam_member.aggregate_publisher",
                  "google_project_iam_member.firestore_users"):
        assert "${" + grant + "}" in pool["depends_on"], f"the aggregator does not wait for {grant}"
    variables = module.variables
    assert variables["aggregator_cpu"]["default"] == "1"
    assert variables["aggregator_memory"]["default"] == "2Gi"
    assert variables["min_aggregators"]["default"] == 0
    assert variables["max_aggregators"]["default"] == 1
    assert "lease" in variables["max_aggregators"]["description"]
    assert module.outputs["aggregator_pool"]["value"] == (
        "${google_cloud_run_v2_worker_pool.aggregator.id}")
    account = module.resource("google_service_account", "aggregate")
    assert account["account_id"] == "${var.name_prefix}-aggregate"  # kept for existing deploys
    assert account["display_name"] == "bucketlearn aggregator"


def _evaluate(tmp_path: Path, expressions: list[str]) -> list[Any]:
    """Evaluate expressions with `terraform console` (no provider needed)."""
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed; expressions not evaluated")
    (tmp_path / "main.tf").write_text("")
    result = subprocess.run([terraform, "console"],
                            input="jsonencode([" + ", ".join(expressions) + "])\n",
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull})
    assert result.returncode == 0, result.stderr
    answers = json.loads(json.loads(result.stdout.strip()))
    assert len(answers) == len(expressions), result.stdout
    return answers


@pytest.mark.parametrize(("variable", "allowed", "refused"), [
    ("max_aggregators", [1, 2, 10], [0, 11, 1.5, -1]),
    ("min_aggregators", [0, 1, 10], [11, 0.5, -1]),
])
def test_aggregator_bounds(module: Config, tmp_path: Path, variable: str,
                           allowed: list[float], refused: list[float]) -> None:
    (validation,) = module.variables[variable]["validation"]
    condition = _strip(validation["condition"])
    values = allowed + refused
    answers = _evaluate(tmp_path, [condition.replace(f"var.{variable}", repr(v)) for v in values])
    assert answers == [True] * len(allowed) + [False] * len(refused), list(zip(values, answers,
                                                                              strict=True))


def test_aggregator_has_exactly_what_it_needs(module: Config) -> None:
    # Pull results and ack them, read manifests, fold and delete results, write weights and
    # exports, publish the next round; Firestore. No results publisher, no project-wide role
    # but Firestore's.
    work, deltas = "${google_storage_bucket.work.name}", "${google_storage_bucket.deltas.name}"
    models = "${google_storage_bucket.models.name}"
    assert grants_to(module, "aggregate") == {
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", work),
        ("google_storage_bucket_iam_member", "roles/storage.objectUser", deltas),
        ("google_storage_bucket_iam_member", "roles/storage.objectUser", models),
        ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
         "${google_pubsub_topic.tasks.name}"),
        ("google_pubsub_subscription_iam_member", "roles/pubsub.subscriber",
         "${google_pubsub_subscription.results.name}"),
        ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
         "${google_pubsub_topic.results.name}"),
        ("google_project_iam_member", "roles/datastore.user", "project"),
    }


def test_learners_have_exactly_what_they_need(module: Config) -> None:
    # Pull tasks, read shards and weights, write results and announce them; predict the parts
    # of a large batch prediction (read predict/, write and compose predictions/).
    work, deltas = "${google_storage_bucket.work.name}", "${google_storage_bucket.deltas.name}"
    models, uploads = "${google_storage_bucket.models.name}", "${google_storage_bucket.uploads.name}"
    assert grants_to(module, "worker") == {
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", work),
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", models),
        ("google_storage_bucket_iam_member", "roles/storage.objectCreator", deltas),
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", uploads),
        ("google_storage_bucket_iam_member", "roles/storage.objectUser", models),
        ("google_pubsub_subscription_iam_member", "roles/pubsub.subscriber",
         "${google_pubsub_subscription.tasks.name}"),
        ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
         "${google_pubsub_topic.results.name}"),
        ("google_project_iam_member", "roles/datastore.user", "project"),
    }
    pool = module.resource("google_cloud_run_v2_worker_pool", "learners")
    assert "${google_pubsub_subscription_iam_member.worker_subscriber}" in pool["depends_on"]
    # the two prediction grants each held to their prefix by a condition on the object's name
    prefixes = module.locals["worker_prefix_roles"]
    assert {(p["bucket"], p["prefix"], p["role"]) for p in prefixes.values()} == {
        (uploads, "predict/", "roles/storage.objectViewer"),
        (models, "predictions/", "roles/storage.objectUser")}
    (condition,) = module.resource("google_storage_bucket_iam_member",
                                   "worker_prefixes")["condition"]
    assert condition["expression"].replace('\\"', '"') == (
        'resource.name.startsWith("projects/_/buckets/${each.value.bucket}'
        '/objects/${each.value.prefix}")')
    assert "${google_storage_bucket_iam_member.worker_prefixes}" in pool["depends_on"]


def test_the_upload_function_has_exactly_what_it_needs(module: Config) -> None:
    # Read uploads, write shards, create the first weights (create-only), publish the first
    # round; Firestore. Batch prediction: read models/ (a job's exported model) and write
    # predictions/ (replacing an earlier output of the same name), each under a condition on
    # the object's name: no read of weights/, no replace or delete of an exported model.
    work, uploads = "${google_storage_bucket.work.name}", "${google_storage_bucket.uploads.name}"
    models = "${google_storage_bucket.models.name}"
    assert grants_to(module, "split") == {
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", uploads),
        ("google_storage_bucket_iam_member", "roles/storage.objectUser", work),
        ("google_storage_bucket_iam_member", "roles/storage.objectCreator", models),
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", models),
        ("google_storage_bucket_iam_member", "roles/storage.objectUser", models),
        ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
         "${google_pubsub_topic.tasks.name}"),
        ("google_project_iam_member", "roles/datastore.user", "project"),
    }
    prefixes = module.locals["split_models_prefix_roles"]
    assert {p["prefix"]: p["role"] for p in prefixes.values()} == {
        "models/": "roles/storage.objectViewer", "predictions/": "roles/storage.objectUser"}
    grant = module.resource("google_storage_bucket_iam_member", "split_models_prefixes")
    (condition,) = grant["condition"]
    assert condition["expression"].replace('\\"', '"') == (
        'resource.name.startsWith("projects/_/buckets/${google_storage_bucket.models.name}'
        '/objects/${each.value.prefix}")')
    function = module.resource("google_cloudfunctions2_function", "split")
    assert "${google_storage_bucket_iam_member.split_models_prefixes}" in function["depends_on"]


# --- CPU and memory ----------------------------------------------------------------------------

# Cloud Run's rule (docs: configuring CPU limits and memory limits; 2nd gen functions run on Cloud
# Run): whole vCPUs -> the memory range allowed, in GiB.
CLOUD_RUN_MEMORY_GIB = {1: (0.5, 4), 2: (0.5, 8), 4: (2, 16), 6: (4, 24), 8: (4, 32)}


def _strip(expression: str) -> str:
    return expression[2:-1] if expression.startswith("${") else expression


def _memory_precondition(body: dict[str, Any]) -> str:
    (condition,) = [c["condition"] for lifecycle in body.get("lifecycle", [])
                    for c in lifecycle.get("precondition", [])
                    if "memory_mib_range_by_cpu" in c["condition"]]
    return _strip(condition)


@pytest.mark.parametrize("component", ["worker", "aggregator", "function"])
def test_cpu_and_memory_are_checked_together(module: Config, tmp_path: Path,
                                             component: str) -> None:
    """The module's own precondition, evaluated by `terraform console` (no provider needed)
    for every CPU the variable allows and memory sizes around Cloud Run's limits."""
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed; the CPU/memory preconditions were not evaluated")
    if component in ("worker", "aggregator"):
        pool = "learners" if component == "worker" else "aggregator"
        bodies = [module.resource("google_cloud_run_v2_worker_pool", pool)]
        memories = ["512Mi", "1Gi", "2047Mi", "2Gi", "4Gi", "4097Mi", "8Gi", "16Gi", "24Gi",
                    "32Gi", "33Gi"]
    else:
        bodies = [module.resource("google_cloudfunctions2_function", "split")]
        memories = ["1Gi", "2Gi", "4Gi", "8Gi", "16Gi"]
    conditions = {_memory_precondition(body) for body in bodies}
    assert len(conditions) == 1, conditions
    condition = conditions.pop()
    cpu_var, memory_var = f"var.{component}_cpu", f"var.{component}_memory"
    cpus = re.findall(r'"(\d+)"', module.variables[f"{component}_cpu"]["validation"][0][
        "condition"])
    assert cpus and {int(c) for c in cpus} <= set(CLOUD_RUN_MEMORY_GIB)
    ranges = module.locals["memory_mib_range_by_cpu"]
    (tmp_path / "main.tf").write_text("locals {\n  memory_mib_range_by_cpu = {\n" + "".join(
        f'    "{cpu}" = [{low}, {high}]\n' for cpu, (low, high) in ranges.items()) + "  }\n}\n")
    size = _strip(module.locals[f"{component}_memory_mib"])
    cases, lines = [], []
    for cpu in cpus:
        for memory in memories:
            gib = int(memory[:-2]) / (1024 if memory.endswith("Mi") else 1)
            low, high = CLOUD_RUN_MEMORY_GIB[int(cpu)]
            cases.append((cpu, memory, low <= gib <= high))
            expression = condition.replace(f"local.{component}_memory_mib", f"({size})")
            lines.append(expression.replace(memory_var, f'"{memory}"')
                         .replace(cpu_var, f'"{cpu}"'))
    # Piped, `terraform console` prints only its last expression: evaluate one list.
    result = subprocess.run([terraform, "console"],
                            input="jsonencode([" + ", ".join(lines) + "])\n",
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull})
    assert result.returncode == 0, result.stderr
    answers = json.loads(json.loads(result.stdout.strip()))
    assert len(answers) == len(cases), result.stdout
    wrong = [(cpu, memory, expected)
             for (cpu, memory, expected), answer in zip(cases, answers, strict=True)
             if answer is not expected]
    assert not wrong, f"precondition disagrees with Cloud Run (cpu, memory, allowed): {wrong}"
    default = {v: module.variables[f"{component}_{v}"]["default"] for v in ("cpu", "memory")}
    assert (default["cpu"], default["memory"], True) in cases


# --- storage -----------------------------------------------------------------------------------

def test_buckets(module: Config) -> None:
    buckets = {name: body for _t, name, body in module.resources("google_storage_bucket")}
    assert {"uploads", "work", "deltas", "models"} <= set(buckets)
    for name, body in buckets.items():
        assert body["uniform_bucket_level_access"] is True, name
        assert body["public_access_prevention"] == "enforced", name
    assert buckets["models"]["versioning"][0]["enabled"] is True
    ages = {name: [rule["condition"][0].get("age") for rule in body.get("lifecycle_rule", [])
                   if rule["action"][0]["type"] == "Delete"]
            for name, body in buckets.items()}
    assert "${var.deltas_retention_days}" in ages["deltas"]
    assert "${var.work_retention_days}" in ages["work"]
    assert module.variables["deltas_retention_days"]["default"] == 1


def test_models_bucket_deletes_noncurrent_generations_by_count_and_by_age(
        module: Config, tmp_path: Path) -> None:
    """A noncurrent generation goes once models_noncurrent_versions newer ones exist, or after
    models_noncurrent_retention_days whatever came after it: the weights of a finished job,
    which the app deletes, have no newer generation, and the first rule alone kept their last
    copy for ever."""
    # Prepare
    models = module.resource("google_storage_bucket", "models")
    # Execute
    deletes = [rule["condition"][0] for rule in models["lifecycle_rule"]
               if rule["action"][0]["type"] == "Delete"]
    # Assert
    assert models["versioning"][0]["enabled"] is True
    assert {"num_newer_versions": "${var.models_noncurrent_versions}",
            "with_state": "ARCHIVED"} in deletes
    assert {"days_since_noncurrent_time": "${var.models_noncurrent_retention_days}",
            "with_state": "ARCHIVED"} in deletes
    parts = {"age": 1, "matches_prefix": [layout.PREDICTION_PARTS_PREFIX], "with_state": "ANY"}
    assert parts in deletes  # a batch prediction's parts, a day after written
    assert len(deletes) == 3, deletes  # nothing else deletes a live model
    variable = module.variables["models_noncurrent_retention_days"]
    assert variable["type"] in ("${number}", "number"), variable["type"]
    assert variable["default"] == 7
    assert "deleted" in variable["description"]
    (validation,) = variable["validation"]
    allowed, refused = [1, 7, 365], [0, -1, 1.5]
    answers = _evaluate(tmp_path, [
        _strip(validation["condition"]).replace("var.models_noncurrent_retention_days", repr(v))
        for v in allowed + refused])
    assert answers == [True] * len(allowed) + [False] * len(refused), answers


# --- Firestore ---------------------------------------------------------------------------------

FIRESTORE_ADAPTER = ROOT / "bucketlearn" / "adapters" / "firestore.py"


def test_worker_heartbeats_expire(module: Config) -> None:
    """Heartbeat documents (collection "workers") carry expire_at, their last heartbeat + 1
    day; a TTL policy on that field lets Firestore delete them, where they used to stay for
    ever. No single-field index is kept on it (nothing queries it)."""
    # Prepare
    fields = {name: body for _t, name, body in module.resources("google_firestore_field")}
    # Execute
    ttl = {name: body for name, body in fields.items() if "ttl_config" in body}
    # Assert
    assert list(ttl) == ["workers_expire_at"], fields
    field = ttl["workers_expire_at"]
    assert (field["collection"], field["field"]) == ("workers", "expire_at")
    assert field["ttl_config"] == [{}]
    assert field["index_config"] == [{}]  # empty: no single-field index on expire_at
    assert field["database"] == "${local.firestore_database}"
    assert field["project"] == "${var.project_id}"
    # Created after the database it configures, when the module creates it.
    assert "${google_firestore_database.this}" in field["depends_on"]
    assert "google_firestore_field" in (MODULE / "firestore.tf").read_text()
    # The collection the heartbeats are written to.
    assert re.search(r'collection\(\s*"workers"\s*\)', FIRESTORE_ADAPTER.read_text())


def test_the_running_predictions_query_has_its_collection_group_index(module: Config) -> None:
    """The autoscaler's collection-group query on predictions' state (the adapter's
    running_predictions) is served by a single-field index of collection-group scope."""
    field = module.resource("google_firestore_field", "predictions_state")
    assert (field["collection"], field["field"]) == ("predictions", "state")
    assert field["index_config"][0]["indexes"] == [
        {"order": "ASCENDING", "query_scope": "COLLECTION_GROUP"},
        {"order": "ASCENDING", "query_scope": "COLLECTION"}]  # the default kept too
    controller = module.resource("google_cloud_run_v2_job", "autoscaler")
    assert "${google_firestore_field.predictions_state}" in controller["depends_on"]
    assert field["database"] == "${local.firestore_database}"
    adapter = FIRESTORE_ADAPTER.read_text()
    assert 'collection_group("predictions")' in adapter
    assert 'FieldFilter("state", "==", "RUNNING")' in adapter


FIRESTORE_DATABASE_USES = {
    # what reads the database id -> the expression that must name local.firestore_database
    "BUCKETLEARN_FIRESTORE_DATABASE": lambda m: m.locals["app_env"][
        "BUCKETLEARN_FIRESTORE_DATABASE"],
    "the database": lambda m: m.resource("google_firestore_database", "this")["name"],
    "the rules release": lambda m: m.resource("google_firebaserules_release", "firestore")[
        "name"],
    "the IAM conditions": lambda m: m.locals["firestore_database_resource"],
    "the output": lambda m: m.outputs["firestore_database"]["value"],
    "the TTL field": lambda m: m.resource("google_firestore_field", "workers_expire_at")[
        "database"],
}


def test_every_use_of_the_firestore_database_goes_through_the_local(module: Config) -> None:
    for use, read in FIRESTORE_DATABASE_USES.items():
        expression = read(module)
        assert "local.firestore_database" in expression, f"{use}: {expression}"
        assert "var.firestore_database" not in expression, f"{use}: {expression}"
    grants = module.resource("google_project_iam_member", "firestore_users")
    assert "local.firestore_database_resource" in json.dumps(grants)
    # var.firestore_database is read by the local (and its own validation) and nowhere else.
    readers = {path.name: sum(line.count("var.firestore_database")
                              for line in path.read_text().splitlines()
                              if not line.lstrip().startswith("#"))
               for path in sorted(MODULE.glob("*.tf"))}
    readers = {name: count for name, count in readers.items() if count}
    assert set(readers) == {"main.tf", "variables.tf"}, readers
    assert readers["main.tf"] == 1, readers


def _matching(pattern: str) -> list[str]:
    """A few strings matching a name_prefix-like pattern, ^[a-z][a-z0-9-]{m,n}[a-z0-9]$, at
    each length it allows: the edges of every character class."""
    match = re.fullmatch(r"\^\[a-z\]\[a-z0-9-\]\{(\d+),(\d+)\}\[a-z0-9\]\$", pattern)
    assert match, f"name_prefix's pattern changed, teach _matching: {pattern}"
    low, high = int(match.group(1)), int(match.group(2))
    return [first + middle * size + last
            for size in range(low, high + 1)
            for first in "az" for middle in "a9-" for last in "z0"]


def test_the_firestore_database_is_one_per_prefix_by_default(module: Config,
                                                              tmp_path: Path) -> None:
    """Two name_prefixes in one project used to share the "(default)" database (the module's
    default), hence every collection. The default is now the prefix's own, a valid Firestore
    database id for every valid name_prefix; "(default)" or any id can still be given."""
    # Prepare
    variable = module.variables["firestore_database"]
    assert variable["default"] is None
    (prefix_validation,) = module.variables["name_prefix"]["validation"]
    (prefix_pattern,) = re.findall(r'regex\("([^"]+)"', prefix_validation["condition"])
    (database_validation,) = variable["validation"]
    (database_pattern,) = re.findall(r'regex\("([^"]+)"', database_validation["condition"])
    assert database_pattern == "^[a-z][a-z0-9-]{2,61}[a-z0-9]$"  # Firestore's rule
    prefixes = [module.variables["name_prefix"]["default"], *_matching(prefix_pattern)]
    assert all(re.fullmatch(prefix_pattern, p) for p in prefixes)
    explicit = ["(default)", "jobs-db"]
    cases = [(p, None) for p in prefixes] + [("env-a", d) for d in explicit]
    local = _strip(module.locals["firestore_database"])
    condition = _strip(database_validation["condition"])
    # Execute
    answers = _evaluate_in_module(
        module, tmp_path,
        [local.replace("var.name_prefix", f'"{p}"').replace(
            "var.firestore_database", "null" if d is None else f'"{d}"') for p, d in cases]
        + [condition.replace("var.firestore_database", v)
           for v in ("null", '"(default)"', '"env-a-db"', '"Env"', '"abc"', '"db-"')],
        {}, {})
    names, valid = answers[:len(cases)], answers[len(cases):]
    # Assert
    defaults = dict(zip(prefixes, names[:len(prefixes)], strict=True))
    for prefix, name in defaults.items():
        assert re.fullmatch(database_pattern, name), (prefix, name)
        assert prefix in name, (prefix, name)
    assert len(set(defaults.values())) == len(defaults), "two prefixes share a database"
    assert "(default)" not in defaults.values()
    assert names[len(prefixes):] == explicit
    assert valid == [True, True, True, False, False, False]


# --- IAM ---------------------------------------------------------------------------------------

def iam_resources(config: Config) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for rtype, name, body in config.resources():
        if "_iam_" in rtype:
            yield rtype, name, body


def test_no_primitive_roles_and_no_public_members(module: Config, example: Config) -> None:
    seen = 0
    for config in (module, example):
        for rtype, name, body in iam_resources(config):
            seen += 1
            roles = config.expand([body.get("role"), body.get("for_each")])
            members = config.expand([body.get("member"), body.get("members"), body.get("for_each")])
            for role in FORBIDDEN_ROLES:
                pattern = re.escape(role) + r"(?![\w.])"
                assert not re.search(pattern, roles), f"{rtype}.{name}: {role}"
            for member in PUBLIC_MEMBERS:
                assert member not in members, f"{rtype}.{name}: {member}"
    assert seen >= 10
    # Members that come from variables: refused by validation and absent from defaults.
    users = module.variables["dashboard_users"]
    assert users["default"] == []
    assert "validation" in users
    # And nowhere in any .tf file as a literal.
    for path in tf_files():
        text = path.read_text()
        assert not re.search(r'"(allUsers|allAuthenticatedUsers)"', text), path
        assert not re.search(r'"roles/(owner|editor|viewer)"', text), path


def test_project_level_grants_are_only_the_unavoidable_ones(module: Config) -> None:
    allowed = {"roles/datastore.user", "roles/datastore.viewer", "roles/eventarc.eventReceiver",
               "roles/pubsub.publisher"}
    # The build account's roles: logs (no narrower resource), and the storage roles on the
    # build's own buckets, which Cloud Functions and gcloud create (so there is no bucket
    # resource to grant on), each under an IAM condition naming them
    # (test_the_build_account_reaches_only_the_builds_buckets). The registry writer role is on
    # the images repository.
    build_roles = {"roles/logging.logWriter", "roles/storage.objectAdmin",
                   "roles/storage.objectViewer"}
    for _rtype, name, body in module.resources("google_project_iam_member"):
        if name == "build":
            assert body["member"] == "serviceAccount:${local.build_service_account}"
            assert set(re.findall(r'"(roles/[\w.]+)"', module.locals["build_roles"])) == (
                build_roles)
            continue
        assert body["role"] in allowed, f"project-level {body['role']} ({name})"
        if body["role"] == "roles/pubsub.publisher":
            # Only the Cloud Storage service agent (Eventarc makes its topics), never our accounts.
            assert "google_storage_project_service_account" in body["member"], name


def _target(rtype: str, body: dict[str, Any], entry: dict[str, Any]) -> str:
    if rtype == "google_project_iam_member":
        return "project"
    for key in ("bucket", "topic", "subscription", "service_account_id", "repository", "name"):
        if key in entry:
            return entry[key]
        if key in body:
            return body[key]
    raise AssertionError(f"{rtype}: no resource granted on")


def grants_to(config: Config, account: str) -> set[tuple[str, str, str]]:
    """(IAM resource type, role, what it is granted on) of every grant to one of the module's
    service accounts, through for_each maps of roles or of members."""
    ref = f"google_service_account.{account}.email"
    grants = set()
    for rtype, _name, body in iam_resources(config):
        member = str(body.get("member", ""))
        refs = re.findall(r"local\.(\w+)", str(body.get("for_each", "")))
        items = config.locals.get(refs[0], {}) if refs else {}
        if ref in member:
            entries = list(items.values()) if isinstance(items, dict) and items else [{}]
            for entry in entries:
                entry = entry if isinstance(entry, dict) else {}
                role = entry.get("role", body["role"])
                grants.add((rtype, role, _target(rtype, body, entry)))
        elif "each.value" in member and isinstance(items, dict) and any(
                ref in str(value) for value in items.values()):
            grants.add((rtype, body["role"], _target(rtype, body, {})))
    return grants


def test_the_controller_has_exactly_what_its_steps_need(module: Config) -> None:
    # `bucketlearn autoscale`: the watchdog (drain the dead-letter sink into failure markers;
    # list results, write nudges, read manifests, publish lost tasks; Firestore), then the
    # resize. Nothing project-wide but Firestore (which has no narrower resource), and no
    # delete anywhere: nudges and markers are write-once names.
    deltas, work = "${google_storage_bucket.deltas.name}", "${google_storage_bucket.work.name}"
    assert grants_to(module, "autoscaler") == {
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", deltas),
        ("google_storage_bucket_iam_member", "roles/storage.objectCreator", deltas),
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer", work),
        ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
         "${google_pubsub_topic.tasks.name}"),
        ("google_pubsub_topic_iam_member", "roles/pubsub.publisher",
         "${google_pubsub_topic.results.name}"),
        ("google_pubsub_subscription_iam_member", "roles/pubsub.subscriber",
         "${google_pubsub_subscription.dead_letter_sink.name}"),
        ("google_project_iam_member", "roles/datastore.user", "project"),
        ("google_cloud_run_v2_worker_pool_iam_member", "roles/run.developer",
         "${google_cloud_run_v2_worker_pool.learners.name}"),
        ("google_cloud_run_v2_worker_pool_iam_member", "roles/run.developer",
         "${google_cloud_run_v2_worker_pool.aggregator.name}"),
        ("google_service_account_iam_member", "roles/iam.serviceAccountUser",
         "${google_service_account.worker.name}"),
        ("google_service_account_iam_member", "roles/iam.serviceAccountUser",
         "${google_service_account.aggregate.name}"),
    }
    # The sink grant goes with dead-lettering, as the environment variable does.
    (sink_grant,) = [body for _t, _n, body in module.resources(
        "google_pubsub_subscription_iam_member") if "dead_letter_sink" in body["subscription"]]
    assert sink_grant.get("count") == "${var.dead_letter_enabled ? 1 : 0}"
    # The job starts after its grants.
    job = module.resource("google_cloud_run_v2_job", "autoscaler")
    depends_on = set(job["depends_on"])
    for grant in ("google_storage_bucket_iam_member.autoscaler",
                  "google_pubsub_topic_iam_member.autoscaler_publisher",
                  "google_pubsub_topic_iam_member.autoscaler_results_publisher",
                  "google_pubsub_subscription_iam_member.autoscaler_dead_letter_subscriber",
                  "google_cloud_run_v2_worker_pool_iam_member.autoscaler_developer",
                  "google_cloud_run_v2_worker_pool_iam_member.autoscaler_aggregator_developer",
                  "google_project_iam_member.firestore_users"):
        assert "${" + grant + "}" in depends_on, f"the autoscaler job does not wait for {grant}"


def test_the_dead_letter_sink_has_one_consumer(module: Config) -> None:
    members = [body["member"] for _t, _n, body in module.resources(
        "google_pubsub_subscription_iam_member") if "dead_letter_sink" in body["subscription"]]
    assert members == ["serviceAccount:${google_service_account.autoscaler.email}"]

def test_the_dashboard_can_write_job_documents_to_cancel_them(module: Config) -> None:
    """The dashboard's "Cancel job" button writes the job's document, which
    roles/datastore.viewer cannot; it gets roles/datastore.user like the other writers, on the
    same (optionally conditioned) grant, and no separate viewer grant is left behind."""
    # Prepare
    grants = [(name, body) for _t, name, body in module.resources("google_project_iam_member")
              if "dashboard" in config_text(body, module)]
    # Execute
    roles = {body["role"] for _name, body in grants}
    # Assert
    assert roles == {"roles/datastore.user"}, grants
    writers = module.resource("google_project_iam_member", "firestore_users")
    assert writers["for_each"] == "${local.firestore_writers}"
    assert module.locals["firestore_writers"]["dashboard"] == (
        "${google_service_account.dashboard.email}")
    depends = module.resource("google_cloud_run_v2_service", "dashboard")["depends_on"]
    assert "${google_project_iam_member.firestore_users}" in depends


def config_text(body: dict[str, Any], module: Config) -> str:
    """A resource's member, with the locals it reads expanded."""
    return module.expand([body.get("member"), body.get("for_each")])


# --- IAM conditions, evaluated -----------------------------------------------------------------
#
# What a grant's IAM condition lets through depends on values known only at plan time (the
# project number, the region, the database). These helpers rebuild the module's locals and the
# grant's for_each / condition blocks in a scratch directory, with the values a test picks, and
# let `terraform console` evaluate them; _cel_allows then reads the resulting condition the way
# IAM would for a given resource name.

_RESOURCE_REF = re.compile(r"\b(?:data\.)?google_\w+\.\w+(?:\[\d+\])?\.\w+\b")


def _hcl(value: Any) -> str:
    """HCL source for a value python-hcl2 parsed (its strings keep their source escapes, and an
    expression is a string holding one interpolation, which HCL evaluates to the value itself).
    A resource attribute becomes a string naming it: no provider runs here."""
    if isinstance(value, str):
        return '"' + _RESOURCE_REF.sub(lambda m: '"' + m.group(0) + '"', value) + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_hcl(item) for item in value) + "]"
    return "{" + ", ".join(f'"{key}" = {_hcl(item)}' for key, item in value.items()) + "}"


def _evaluate_in_module(module: Config, directory: Path, expressions: list[str],
                        variables: dict[str, Any], locals_: dict[str, Any]) -> list[Any]:
    """Evaluate expressions written in the module's terms: every local they read (recursively)
    is the module's own unless given in ``locals_``; every variable is ``variables[name]``, else
    the module's default."""
    directory.mkdir(parents=True, exist_ok=True)
    texts, seen, pending = list(expressions), set(), list(expressions)
    while pending:
        for name in set(re.findall(r"\blocal\.(\w+)", pending.pop())) - seen:
            seen.add(name)
            if name not in locals_:
                assert name in module.locals, f"no local {name} in the module"
                pending.append(json.dumps(module.locals[name]))
                texts.append(json.dumps(module.locals[name]))
    lines = ["locals {"]
    for name in sorted(seen):
        value = _hcl(locals_[name]) if name in locals_ else _hcl(module.locals[name])
        lines.append(f"  {name} = {value}")
    lines.append("}")
    for name in sorted({ref for text in texts for ref in re.findall(r"\bvar\.(\w+)", text)}):
        if name in variables:
            default = variables[name]
        else:
            assert "default" in module.variables[name], f"the test must give var.{name}"
            default = module.variables[name]["default"]
        lines.append(f'variable "{name}" {{\n  default = {_hcl(default)}\n}}')
    (directory / "scope.tf").write_text("\n".join(lines) + "\n")
    return _evaluate(directory, [_RESOURCE_REF.sub(lambda m: '"' + m.group(0) + '"', e)
                                 for e in expressions])


def _effective_grants(module: Config, directory: Path, body: dict[str, Any],
                      variables: dict[str, Any], locals_: dict[str, Any] | None = None,
                      extra: list[str] = ()) -> tuple[dict[str, dict[str, Any]], list[Any]]:
    """Each instance of an IAM member resource (its for_each key, or "" without for_each) ->
    {"role", "member", "conditions": [the expression of each condition it gets]}, evaluated;
    and the values of the ``extra`` expressions."""
    def each(text: Any) -> str:
        return re.sub(r"\beach\.(value|key)\b", lambda m: "v" if m.group(1) == "value" else "k",
                      _hcl(text))
    static = [c["expression"] for c in body.get("condition", [])]
    conditions = "[" + ", ".join(each(c) for c in static) + "]"
    for block in dynamic_blocks({"dynamic": body.get("dynamic", [])}, "condition"):
        (content,) = block["content"]
        expression = each(content["expression"]).replace("condition.value", "c")
        conditions = f"concat({conditions}, [for c in {each(block['for_each'])} : {expression}])"
    grant = f'{{role = {each(body["role"])}, member = {each(body["member"])}, conditions = {conditions}}}'
    if "for_each" in body:
        expression = f"{{for k, v in {each(body['for_each'])} : k => {grant}}}"
    else:
        expression = f'{{"" = {grant}}}'
    answers = _evaluate_in_module(module, directory, [expression, *extra], variables,
                                  locals_ or {})
    return answers[0], answers[1:]


def _cel_allows(expression: str, name: str) -> bool:
    """Whether a condition lets a request on ``name`` through. Only the forms the module writes
    are understood (``resource.name == "..."`` and ``resource.name.startsWith("...")``, joined by
    ``||``); anything else fails the test, to be taught here first."""
    allowed = False
    for clause in expression.split("||"):
        clause = clause.strip()
        if match := re.fullmatch(r'resource\.name\s*==\s*"([^"]*)"', clause):
            allowed |= name == match.group(1)
        elif match := re.fullmatch(r'resource\.name\.startsWith\("([^"]*)"\)', clause):
            allowed |= name.startswith(match.group(1))
        else:
            raise AssertionError(f"condition clause not understood: {clause!r}")
    return allowed


BUILD_SCOPE = {"project_id": "proj-a", "region": "europe-west1", "name_prefix": "bucketlearn",
               "build_service_account": None}
PROJECT_NUMBER = "123456789012"


def test_the_build_account_reaches_only_the_builds_buckets(module: Config, tmp_path: Path) -> None:
    """Code a build runs (a hostile package's install script in the split
    function's build) acts as the build account. With storage.objectAdmin on the whole project
    it could replace models/<job>/latest.keras, which users load. Every project-level storage
    role of the build account carries a condition, and the conditions let through the build's
    own buckets only: the function build's gcf-v2-sources-<number>-<region> and the image
    builds' <project>_cloudbuild, not a pipeline bucket, not a bucket whose name merely begins
    like one of them (europe-west1 / europe-west10)."""
    # Prepare
    buckets = {name: _hcl(body["name"]) for _t, name, body in module.resources(
        "google_storage_bucket")}
    own = {"gcf-v2-sources-123456789012-europe-west1", "proj-a_cloudbuild"}
    neighbours = {"gcf-v2-sources-123456789012-europe-west10", "proj-a_cloudbuild-other",
                  "gcf-v2-uploads-123456789012-europe-west1"}
    # Execute
    grants, names = _effective_grants(
        module, tmp_path, module.resource("google_project_iam_member", "build"), BUILD_SCOPE,
        {"project_number": PROJECT_NUMBER}, extra=list(buckets.values()))
    pipeline = dict(zip(buckets, names, strict=True))
    # Assert
    roles = {grant["role"] for grant in grants.values()}
    assert not {role for role in roles if role.startswith("roles/artifactregistry.")}, (
        "the registry writer is granted on the images repository, not the project")
    storage = {key: grant for key, grant in grants.items()
               if grant["role"].startswith("roles/storage.")}
    assert storage, "the builds read their source from Cloud Storage"
    for key, grant in storage.items():
        assert grant["conditions"], f"{grant['role']} on every bucket of the project ({key})"
    for bucket, name in pipeline.items():
        assert name not in own, bucket
        for grant in storage.values():
            for condition in grant["conditions"]:
                for resource in (f"projects/_/buckets/{name}",
                                 f"projects/_/buckets/{name}/objects/models/job/latest.keras"):
                    assert not _cel_allows(condition, resource), (grant["role"], resource)
    reached = set()
    for grant in storage.values():
        for condition in grant["conditions"]:
            named = set(re.findall(r"projects/_/buckets/([^/\"]+)", condition))
            assert named and named <= own, f"{grant['role']}: {condition}"
            reached |= named
            for bucket in neighbours:
                assert not _cel_allows(condition, f"projects/_/buckets/{bucket}/objects/x"), (
                    grant["role"], bucket)
            for bucket in named:
                assert _cel_allows(condition, f"projects/_/buckets/{bucket}")  # list
                assert _cel_allows(condition, f"projects/_/buckets/{bucket}/objects/a/b.zip")
    assert reached == own
    # Only the function build's own bucket can be written; the image builds only read.
    writers = {bucket for grant in storage.values() if grant["role"] != "roles/storage.objectViewer"
               for condition in grant["conditions"]
               for bucket in re.findall(r"projects/_/buckets/([^/\"]+)", condition)}
    assert writers == {"gcf-v2-sources-123456789012-europe-west1"}
    # No other project-level grant reaches the build account.
    others = [name for _t, name, body in module.resources("google_project_iam_member")
              if "build_service_account" in config_text(body, module) and name != "build"]
    assert not others, others


def test_the_build_account_pushes_to_the_images_repository_only(module: Config) -> None:
    """Artifactregistry.writer on the one repository, not the project, and
    the split function's build pushes there (build_config.docker_repository) instead of to
    gcf-artifacts, where the account now has no role. The image builds (deploy.sh) wait for
    the grant: time_sleep.iam_propagation depends on it, and deploy.sh applies that first."""
    # Prepare
    grants = [(rtype, name, body) for rtype, name, body in iam_resources(module)
              if "artifactregistry" in json.dumps(body.get("role"))
              or "artifactregistry" in module.expand(body.get("for_each", ""))]
    # Assert
    assert [(rtype, name) for rtype, name, _b in grants] == [
        ("google_artifact_registry_repository_iam_member", "build_writer")]
    (_rtype, _name, writer) = grants[0]
    assert writer["role"] == "roles/artifactregistry.writer"
    assert writer["member"] == "serviceAccount:${local.build_service_account}"
    assert writer["repository"] == "${google_artifact_registry_repository.images.name}"
    assert writer["location"] == "${google_artifact_registry_repository.images.location}"
    assert writer["count"] == "${var.build_service_account == null ? 1 : 0}"
    (build,) = module.resource("google_cloudfunctions2_function", "split")["build_config"]
    assert build["docker_repository"] == "${google_artifact_registry_repository.images.id}"
    triggers = json.dumps(module.resource("time_sleep", "iam_propagation")["triggers"])
    for grant in ("google_artifact_registry_repository_iam_member.build_writer",
                  "google_storage_bucket_iam_member.build_sources_viewer",
                  "google_project_iam_member.build"):
        assert grant in triggers, f"the builds do not wait for {grant}"
    # The split function's source archive: read only, on the module's sources bucket.
    assert grants_to_build(module) >= {
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer",
         "${google_storage_bucket.sources.name}")}


def grants_to_build(module: Config) -> set[tuple[str, str, str]]:
    """(IAM resource type, role, target) of the build account's grants other than the
    project-level ones (test_the_build_account_reaches_only_the_builds_buckets has those)."""
    return {(rtype, body["role"], _target(rtype, body, {}))
            for rtype, _name, body in iam_resources(module)
            if rtype != "google_project_iam_member"
            and body.get("member") == "serviceAccount:${local.build_service_account}"}


def test_the_build_account_has_no_role_on_the_pipelines_buckets(module: Config) -> None:
    """Bucket-level grants to the build account: the sources bucket only."""
    buckets = {target for rtype, _role, target in grants_to_build(module)
               if rtype == "google_storage_bucket_iam_member"}
    assert buckets == {"${google_storage_bucket.sources.name}"}


@pytest.mark.parametrize(("mine", "theirs"), [
    (("env-a", "env-a-db"), ("env-b", "env-b-db")),
    (("bucketlearn", "(default)"), ("env-b", "env-b-db")),
    (("env-b", "env-b-db"), ("bucketlearn", "(default)")),
    # the module's default database for each prefix (firestore_database not given)
    (("env-a", None), ("env-b", None)),
])
def test_an_environment_has_no_firestore_role_on_another_environments_database(
        module: Config, example: Config, tmp_path: Path, mine: tuple[str, str | None],
        theirs: tuple[str, str | None]) -> None:
    """Two environments in one project (two name_prefixes, two databases;
    the default prefix keeps (default)). Firestore roles exist only at project level, so each
    of the module's accounts gets its role under a condition naming this environment's
    database and nothing else, by default and in the example: the other environment's
    accounts have no role on this database, and this one's none on theirs."""
    # Prepare
    assert module.variables["firestore_iam_condition"]["default"] is True
    (call,) = [body for entry in example.blocks("module") for body in entry.values()]
    assert call.get("firestore_iam_condition", True) is True, "the example turns it off"
    grants = [(name, body) for _t, name, body in module.resources("google_project_iam_member")
              if "roles/datastore." in module.expand([body["role"], body.get("for_each")])]
    assert grants, "no Firestore grant"
    database = {env: f"projects/shared-project/databases/{db or env + '-db'}"
                for env, db in (mine, theirs)}
    for name, body in grants:
        # Execute
        evaluated, resources = _effective_grants(
            module, tmp_path / name, body,
            {"project_id": "shared-project", "name_prefix": mine[0], "firestore_database": mine[1]},
            extra=["local.firestore_database_resource"])
        # Assert
        assert resources == [database[mine[0]]]
        accounts = set(module.locals["firestore_writers"]) if "for_each" in body else {""}
        assert set(evaluated) == accounts
        for account, grant in evaluated.items():
            assert grant["conditions"], f"{name}[{account}]: {grant['role']} on every database"
            for condition in grant["conditions"]:
                assert re.findall(r'"([^"]*)"', condition) == [database[mine[0]]], condition
                assert _cel_allows(condition, database[mine[0]]), condition
                for resource in (database[theirs[0]],
                                 database[theirs[0]] + "/documents/jobs/j1"):
                    assert not _cel_allows(condition, resource), (name, account, resource)


def test_service_accounts_wait_for_the_iam_api(module: Config) -> None:
    # A plain `terraform apply` on a fresh project would otherwise race iam.googleapis.com.
    for _rtype, name, body in module.resources("google_service_account"):
        assert "${google_project_service.apis}" in body.get("depends_on", []), name
    assert "iam.googleapis.com" in module.locals["apis"]


def test_one_service_account_per_component(module: Config) -> None:
    accounts = {name for _t, name, _b in module.resources("google_service_account")}
    assert {"split", "aggregate", "worker", "dashboard", "autoscaler"} <= accounts
    split = module.resource("google_cloudfunctions2_function", "split")
    assert "google_service_account.split." in split["service_config"][0]["service_account_email"]
    pool = module.resource("google_cloud_run_v2_worker_pool", "learners")
    assert "google_service_account.worker." in pool["template"][0]["service_account"]
    aggregator = module.resource("google_cloud_run_v2_worker_pool", "aggregator")
    assert "google_service_account.aggregate." in aggregator["template"][0]["service_account"]
    dashboard = module.resource("google_cloud_run_v2_service", "dashboard")
    assert "google_service_account.dashboard." in dashboard["template"][0]["service_account"]
    job = module.resource("google_cloud_run_v2_job", "autoscaler")
    assert "google_service_account.autoscaler." in job["template"][0]["template"][0][
        "service_account"]


def test_the_dashboard_can_only_create_uploads(module: Config) -> None:
    """The dashboard writes each upload under a name of its own, so its role
    on the uploads bucket is create-only: it can neither replace nor delete an upload."""
    roles = module.locals["dashboard_bucket_roles"]
    assert roles["uploads"]["role"] == "roles/storage.objectCreator"
    assert roles["uploads"]["bucket"] == "${google_storage_bucket.uploads.name}"
    assert all(r["role"] in ("roles/storage.objectCreator", "roles/storage.objectViewer")
               for r in roles.values())


def test_dashboard_is_not_public(module: Config) -> None:
    dashboard = module.resource("google_cloud_run_v2_service", "dashboard")
    assert "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER" in dashboard["ingress"]
    assert dashboard["iap_enabled"] == "${local.dashboard_iap}"
    assert set(module.variables["dashboard_access"]["default"].split()) <= {"iap", "internal_lb"}


def test_autoscaler_runs_every_minute_and_owns_the_instance_count(module: Config) -> None:
    job = module.resource("google_cloud_run_v2_job", "autoscaler")
    container = job["template"][0]["template"][0]["containers"][0]
    assert container["command"] == ["bucketlearn"] and container["args"] == ["autoscale"]
    env = module.env_names(dynamic_blocks(job, "env")[0]["for_each"])
    assert {"BUCKETLEARN_WORKER_POOL", "BUCKETLEARN_MIN_WORKERS", "BUCKETLEARN_MAX_WORKERS"} <= env
    assert AGGREGATOR_POOL_ENV <= env
    scheduler = module.resource("google_cloud_scheduler_job", "autoscaler")
    assert scheduler["schedule"] == "${var.autoscaler_schedule}"
    assert module.variables["autoscaler_schedule"]["default"] == "* * * * *"
    assert "google_cloud_run_v2_job.autoscaler.name" in scheduler["http_target"][0]["uri"]
    for pool_name, grant_name in [("learners", "autoscaler_developer"),
                                  ("aggregator", "autoscaler_aggregator_developer")]:
        pool = module.resource("google_cloud_run_v2_worker_pool", pool_name)
        assert "${scaling[0].manual_instance_count}" in pool["lifecycle"][0]["ignore_changes"]
        grant = module.resource("google_cloud_run_v2_worker_pool_iam_member", grant_name)
        assert grant["role"] == "roles/run.developer"
        assert grant["name"] == f"${{google_cloud_run_v2_worker_pool.{pool_name}.name}}"
        assert grant["member"] == "serviceAccount:${google_service_account.autoscaler.email}"


def test_autoscaler_is_told_the_aggregator_pool_and_its_bounds(module: Config) -> None:
    env = controller_env(module)
    pools = {}
    for name, local in [("BUCKETLEARN_WORKER_POOL", "worker_pool_name"),
                        ("BUCKETLEARN_AGGREGATOR_POOL", "aggregator_pool_name")]:
        match = re.search(name + r'\s*=\s*"(projects/\$\{var\.project_id\}/locations/'
                          r'\$\{var\.region\}/workerPools/\$\{local\.(\w+)\})"', env[name])
        assert match, f"{name} is not projects/<p>/locations/<r>/workerPools/<pool>: {env[name]}"
        assert match.group(2) == local, name
        pools[name] = match.group(1)
    assert len(set(pools.values())) == 2
    for bound in ("min", "max"):
        name = f"BUCKETLEARN_{bound.upper()}_AGGREGATORS"
        assert re.search(name + rf"\s*=\s*tostring\(var\.{bound}_aggregators\)", env[name]), (
            env[name])
    # The pool name the controller resizes is the pool Terraform makes.
    assert module.resource("google_cloud_run_v2_worker_pool", "aggregator")["name"] == (
        "${local.aggregator_pool_name}")


# --- Dockerfiles and requirements --------------------------------------------------------------

def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_dockerfile(component: str) -> None:
    path, cmd = DOCKERFILES[component]
    instructions = dockerfile_instructions(path)
    froms = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert froms, "no FROM"
    for image in froms:
        image = image.split()[0]
        pinned = re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image)
        assert pinned, f"{path.name}: FROM {image} is not pinned to a patch release"
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users, f"{path.name} has no USER"
    assert users[-1].split(":")[0] not in {"root", "0"}, f"{path.name} runs as root"
    assert any(k == "HEALTHCHECK" for k, _ in instructions), f"{path.name}: HEALTHCHECK (or NONE)"
    for keyword, rest in instructions:
        if keyword == "RUN" and "pip install" in rest:
            assert "--no-cache-dir" in rest, f"{path.name}: pip install without --no-cache-dir"
        if keyword in ("COPY", "ADD"):
            assert not re.match(r"^\.\s", rest), f"{path.name}: copies the whole context"
    (final_cmd,) = [rest for keyword, rest in instructions if keyword == "CMD"][-1:]
    assert json.loads(final_cmd) == cmd


def test_the_worker_image_runs_blas_on_one_thread() -> None:
    """The learners and the aggregator run on the worker image: numpy's OpenBLAS on one thread
    there, as on the local stack (``bucketlearn.config.ONE_THREAD_BLAS``)."""
    env = " ".join(rest for keyword, rest in dockerfile_instructions(DOCKERFILES["worker"][0])
                   if keyword == "ENV")
    for name, value in ONE_THREAD_BLAS.items():
        assert re.search(rf"(^|\s){name}={value}(\s|$)", env), f"the worker image lacks {name}"


def test_functions_requirements_match_pyproject() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = {re.sub(r"\s+", "", dep) for dep in pyproject["project"]["dependencies"]}
    lines = (ROOT / "functions" / "requirements.txt").read_text().splitlines()
    have = {re.sub(r"\s+", "", line) for line in lines if line.strip() and not line.startswith("#")}
    assert have == wanted


# --- checkov -----------------------------------------------------------------------------------

def checkov_command() -> list[str] | None:
    for candidate in (ROOT / ".venv-checkov" / "bin" / "checkov", shutil.which("checkov")):
        if candidate and Path(candidate).is_file():
            return [str(candidate)]
    try:
        import checkov  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "checkov.main"]


def test_checkov() -> None:
    command = checkov_command()
    if command is None:
        pytest.skip("checkov is not installed: run tests/infra/install_checkov.sh (creates "
                    ".venv-checkov; checkov's pins conflict with the project venv)")
    # checkov runs in its own venv: do not let this interpreter's module path leak into it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(
        [*command, "-d", "infra", "--quiet", "--compact", "--framework", "terraform",
         "--skip-download", "--output", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.stdout.strip(), f"checkov printed nothing:\n{result.stderr[-3000:]}"
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [check for report in reports
              for check in report.get("results", {}).get("failed_checks", [])]
    summary = [report.get("summary", {}) for report in reports]
    assert sum(s.get("passed", 0) for s in summary) > 0, f"checkov checked nothing: {summary}"
    assert not failed, "checkov failed checks:\n" + "\n".join(
        f"{c['check_id']} {c['resource']} {c['file_path']}:{c['file_line_range']}"
        f" {c.get('check_name', '')}" for c in failed)
