"""infra/ checked against the Google providers' own schema, offline (a stand-in for
``terraform validate``, which needs provider plugins that cannot be downloaded here).

The schema is tests/infra/provider_schema.json, extracted from the CDK for Terraform bindings
that are generated from the providers' schema: hashicorp/google and hashicorp/google-beta 6.50.0
(@cdktf/provider-google[-beta] 16.12.1, the last 6.x release) and 6.47.0 (16.9.0, the lower
bound of the pinned range ">= 6.47, < 7.0"), and hashicorp/time 0.13.1 (@cdktf/provider-time
11.0.1). Every resource is checked against both ends of its provider's range, so an argument
added after 6.47 or removed before 6.50 fails here. Regenerate the cache after using a new
resource type or changing a pin: ``.venv/bin/python tests/infra/extract_provider_schema.py``.

What is checked (see tests/infra/provider_schema.py): arguments and blocks of every resource and
data source, recursively (dynamic blocks included), required arguments and blocks, single
blocks written once, ignore_changes / depends_on / attribute references, provider blocks,
module calls, and that each pinned range includes the cached versions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("hcl2", reason="python-hcl2 is not installed (pip install python-hcl2)")

from tests.infra.provider_schema import (  # noqa: E402
    CACHE,
    REGENERATE,
    Config,
    Schema,
    SchemaCacheMissing,
    check_config,
    check_module_calls,
    check_providers,
    satisfies,
    used_types,
)

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
DIRECTORIES = [INFRA / "modules" / "bucketlearn", INFRA / "examples" / "dev"]


@pytest.fixture(scope="module")
def schema() -> Schema:
    return Schema.load()


def snippet(text: str) -> Config:
    """A configuration made of one in-memory file (for checking the checker)."""
    return Config(ROOT / "snippet", files={"main.tf": text})


# --- the cache ---------------------------------------------------------------------------------

def test_cache_records_where_it_comes_from(schema: Schema) -> None:
    data = schema.data
    assert data["regenerate"] == REGENERATE
    assert CACHE.stat().st_size < 1_000_000
    versions = {name: set(entry["versions"]) for name, entry in data["providers"].items()}
    assert versions["google"] == versions["google-beta"] == {"6.47.0", "6.50.0"}
    packages = {v["package"] for entry in data["providers"].values()
                for v in entry["versions"].values()}
    assert "@cdktf/provider-google@16.12.1" in packages
    assert "@cdktf/provider-google-beta@16.12.1" in packages


def test_cache_covers_every_type_infra_uses(schema: Schema) -> None:
    missing = []
    for kind, type_name in sorted(used_types(INFRA)):
        provider = type_name.split("_")[0]
        for version in schema.versions(provider):
            try:
                schema.type_schema(provider, version, kind, type_name)
            except SchemaCacheMissing as error:
                missing.append(str(error))
    assert not missing, "\n".join(sorted(set(missing)))


# --- infra/ against the schema -----------------------------------------------------------------

@pytest.mark.parametrize("directory", DIRECTORIES, ids=lambda d: d.name)
def test_resources_match_the_provider_schema(schema: Schema, directory: Path) -> None:
    errors = check_config(Config(directory), schema)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("directory", DIRECTORIES, ids=lambda d: d.name)
def test_provider_blocks_match_the_provider_schema(schema: Schema, directory: Path) -> None:
    errors = check_providers(Config(directory), schema)
    assert not errors, "\n".join(errors)


def test_module_calls_match_the_module() -> None:
    errors = check_module_calls(Config(INFRA / "examples" / "dev"))
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("directory", DIRECTORIES, ids=lambda d: d.name)
def test_pinned_ranges_hold_the_checked_versions(schema: Schema, directory: Path) -> None:
    config = Config(directory)
    pins = config.required_providers()
    used = {block.provider for block in config.blocks()}
    if directory.name == "dev":  # a root module configures what its child modules use
        used |= {block.provider for block in Config(DIRECTORIES[0]).blocks()}
    for provider in sorted(used):
        assert provider in pins, f"{directory.name}: provider {provider} is used but not pinned"
        assert pins[provider]["source"] == schema.source(provider)
        for version in schema.versions(provider):
            assert satisfies(version, pins[provider]["version"]), (
                f"{directory.name}: {provider} pinned to {pins[provider]['version']!r}, which "
                f"excludes the checked schema {version}")
    # Both ends of the google ranges are checked: nothing below the lower one may be allowed.
    for provider in ("google", "google-beta"):
        major, minor, _patch = min(tuple(map(int, v.split(".")))
                                   for v in schema.versions(provider))
        below = f"{major}.{minor - 1}.99"
        assert not satisfies(below, pins[provider]["version"]), (
            f"{directory.name}: {provider} pinned to {pins[provider]['version']!r}, which allows "
            f"{below}, older than the oldest checked schema {major}.{minor}")


# --- the checker itself ------------------------------------------------------------------------

DASHBOARD = """
resource "google_cloud_run_v2_service" "dashboard" {
  %s
  name        = "d"
  location    = "europe-west1"
  iap_enabled = true
  template {
    containers {
      image = "i"
    }
  }
}
"""


def test_checker_rejects_iap_enabled_on_the_ga_provider(schema: Schema) -> None:
    # As dashboard.tf once stood: no provider argument, so hashicorp/google.
    errors = check_config(snippet(DASHBOARD % ""), schema)
    assert len(errors) == 2, errors  # 6.47.0 and 6.50.0
    assert all("unsupported argument `iap_enabled`" in e and "google-beta 6.50.0" in e
               for e in errors)
    assert not check_config(snippet(DASHBOARD % "provider = google-beta"), schema)


def test_checker_reports_missing_required_arguments_and_blocks(schema: Schema) -> None:
    errors = check_config(snippet("""
resource "google_service_account" "x" {
  display_name = "no account_id"
}
resource "google_cloud_run_v2_service" "y" {
  name     = "y"
  location = "europe-west1"
}
"""), schema)
    assert any("google_service_account.x" in e and "required argument `account_id`" in e
               for e in errors), errors
    assert any("google_cloud_run_v2_service.y" in e and "required block `template`" in e
               for e in errors), errors


def test_checker_walks_nested_and_dynamic_blocks(schema: Schema) -> None:
    errors = check_config(snippet("""
resource "google_cloud_run_v2_worker_pool" "p" {
  count    = 1
  name     = "p"
  location = "europe-west1"
  template {
    containers {
      image = "i"
      resources {
        limits   = { cpu = "1" }
        gpu_kind = "nvidia"
      }
      dynamic "env" {
        for_each = { A = "1" }
        content {
          name  = env.key
          value = env.value
          color = "red"
        }
      }
      dynamic "volume" {
        for_each = []
        content {}
      }
    }
  }
  lifecycle {
    ignore_changes = [scaling[0].manual_instance_count, no_such_field]
  }
  depends_on = [google_project_service.missing]
}
"""), schema)
    text = "\n".join(errors)
    assert "template > containers > resources: unsupported argument `gpu_kind`" in text
    assert 'dynamic "env" > content: unsupported argument `color`' in text
    assert 'dynamic "volume": `volume` is not a block here' in text
    assert "ignore_changes names `no_such_field`" in text
    assert "depends_on names `google_project_service.missing`" in text
    assert "count" not in text and "lifecycle:" not in text


def test_checker_tells_blocks_from_arguments(schema: Schema) -> None:
    errors = check_config(snippet("""
resource "google_cloud_run_v2_job" "j" {
  name     = "j"
  location = "europe-west1"
  template = {}
}
resource "google_pubsub_topic" "t" {
  name = "t"
  labels {
    a = "b"
  }
}
resource "google_storage_bucket" "b" {
  name     = "b"
  location = "EU"
  versioning {
    enabled = true
  }
  versioning {
    enabled = false
  }
}
"""), schema)
    text = "\n".join(errors)
    assert "`template` is a block: write `template { ... }`" in text
    assert "`labels` is an argument: write `labels = ...`" in text
    assert "block `versioning` may appear only once" in text


def test_checker_checks_references_providers_and_modules(schema: Schema, tmp_path: Path) -> None:
    errors = check_config(snippet("""
resource "google_pubsub_topic" "t" {
  name = "t"
}
resource "google_pubsub_subscription" "s" {
  name  = google_pubsub_topic.t.nam
  topic = google_pubsub_topic.u.id
}
"""), schema)
    text = "\n".join(errors)
    assert "google_pubsub_topic.t.nam: google_pubsub_topic has no attribute `nam`" in text
    assert "reference to undeclared google_pubsub_topic.u" in text
    provider_errors = check_providers(snippet("""
provider "google" {
  project               = "p"
  user_project_override = true
  quota_project         = "p"
}
"""), schema)
    assert len(provider_errors) == 2 and all("`quota_project`" in e for e in provider_errors)
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "main.tf").write_text(
        'variable "needed" {\n  type = string\n}\noutput "out" {\n  value = 1\n}\n')
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "main.tf").write_text(
        'module "m" {\n  source = "../child"\n  extra  = 1\n}\n'
        'output "o" {\n  value = module.m.missing\n}\n')
    module_errors = "\n".join(check_module_calls(Config(tmp_path / "root")))
    assert "`extra` is not a variable" in module_errors
    assert "required variable `needed` is not set" in module_errors
    assert "has no output `missing`" in module_errors


def test_checker_names_the_regenerate_command_for_uncached_types(schema: Schema) -> None:
    with pytest.raises(SchemaCacheMissing, match="extract_provider_schema.py"):
        check_config(snippet('resource "google_compute_network" "n" {\n  name = "n"\n}\n'),
                     schema)


@pytest.mark.parametrize(("version", "constraint", "expected"), [
    ("6.50.0", ">= 6.47, < 7.0", True),
    ("6.47.0", ">= 6.47, < 7.0", True),
    ("6.46.0", ">= 6.47, < 7.0", False),
    ("7.0.0", ">= 6.47, < 7.0", False),
    ("6.50.0", "~> 6.47", True),
    ("7.1.0", "~> 6.47", False),
    ("0.13.1", ">= 0.9, < 1.0", True),
])
def test_version_constraints(version: str, constraint: str, expected: bool) -> None:
    assert satisfies(version, constraint) is expected
