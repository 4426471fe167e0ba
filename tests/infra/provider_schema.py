"""Check Terraform configuration against the providers' schema, offline.

The schema comes from tests/infra/provider_schema.json (see extract_provider_schema.py). For
every resource and data source in a directory this module checks, against every cached version
of the provider the resource uses (``provider = google-beta`` picks hashicorp/google-beta; the
type's prefix picks the default):

* each argument and each block exists in the schema, recursively through nested blocks and
  ``dynamic "x" { content { ... } }``; arguments are not written as blocks nor blocks as
  arguments; a block the schema allows once appears once;
* every required argument and required block is present;
* ``lifecycle.ignore_changes`` names attributes of the resource, ``depends_on`` names declared
  resources, and ``type.name.attribute`` references name a declared resource and one of its
  attributes;
* ``provider`` blocks set only arguments of the provider's configuration;
* ``module`` calls with a local source pass only the module's variables, and every variable
  without a default.

Terraform's meta-arguments (count, for_each, provider, depends_on, lifecycle, provisioner,
connection; alias and version in provider blocks) are allowed everywhere Terraform allows them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = HERE / "provider_schema.json"
SCHEMA_FORMAT = 1
REGENERATE = ".venv/bin/python tests/infra/extract_provider_schema.py"

RESOURCE_META_ARGUMENTS = {"count", "for_each", "provider", "depends_on"}
RESOURCE_META_BLOCKS = {"lifecycle", "provisioner", "connection"}
DATA_META_BLOCKS = {"lifecycle"}
PROVIDER_META_ARGUMENTS = {"alias", "version"}
DYNAMIC_ARGUMENTS = {"for_each", "iterator", "labels"}

_REFERENCE = re.compile(
    r"(?<![\w.-])(data\.)?([a-z][a-z0-9]*_[a-z0-9_]+)\.([a-zA-Z_][\w-]*)"
    r"(?:\[[^\]]*\])?\.([a-z_][a-z0-9_]*)")


class SchemaCacheMissing(LookupError):
    """infra/ uses a type the cached schema was not extracted for."""


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return path.name


def _is_block_list(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, dict) and v.get("__is_block__") for v in value))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if not key.startswith("__"):
                yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _expression(value: Any) -> str:
    """The text of a bare expression as python-hcl2 gives it ("${x.y}" or "x.y")."""
    text = str(value).strip()
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1]
    return text


@dataclass(frozen=True)
class Block:
    """A resource or data source (kind "resource" / "data") as written in one file."""

    kind: str
    type_name: str
    name: str
    body: dict[str, Any]
    path: Path

    @property
    def address(self) -> str:
        prefix = "data." if self.kind == "data" else ""
        return f"{prefix}{self.type_name}.{self.name}"

    @property
    def provider(self) -> str:
        """Local name of the provider this block uses."""
        if "provider" in self.body:
            return _expression(self.body["provider"]).split(".")[0]
        return self.type_name.split("_")[0]


class Config:
    """The .tf files of one directory (a module or a root), parsed by python-hcl2."""

    def __init__(self, directory: Path, files: dict[str, str] | None = None) -> None:
        import hcl2

        self.directory = directory
        self.files: dict[Path, dict[str, Any]] = {}
        if files is None:
            files = {p.name: p.read_text() for p in sorted(directory.glob("*.tf"))}
        for name, text in files.items():
            self.files[directory / name] = hcl2.loads(text)

    def top(self, kind: str) -> Iterator[tuple[Path, dict[str, Any]]]:
        for path, parsed in self.files.items():
            for entry in parsed.get(kind, []):
                yield path, entry

    def blocks(self) -> Iterator[Block]:
        for kind in ("resource", "data"):
            for path, entry in self.top(kind):
                for type_name, named in entry.items():
                    for name, body in named.items():
                        yield Block(kind, _unquote(type_name), _unquote(name), body, path)

    def providers(self) -> Iterator[tuple[Path, str, dict[str, Any]]]:
        for path, entry in self.top("provider"):
            for name, body in entry.items():
                yield path, _unquote(name), body

    def modules(self) -> Iterator[tuple[Path, str, dict[str, Any]]]:
        for path, entry in self.top("module"):
            for name, body in entry.items():
                yield path, _unquote(name), body

    def variables(self) -> dict[str, dict[str, Any]]:
        return {_unquote(name): body for _p, entry in self.top("variable")
                for name, body in entry.items()}

    def outputs(self) -> set[str]:
        return {_unquote(name) for _p, entry in self.top("output") for name in entry}

    def required_providers(self) -> dict[str, dict[str, str]]:
        found: dict[str, dict[str, str]] = {}
        for _path, terraform in self.top("terraform"):
            for block in terraform.get("required_providers", []):
                for name, spec in block.items():
                    if isinstance(spec, dict):
                        found[_unquote(name)] = {k: _unquote(str(v)) for k, v in spec.items()
                                                 if not k.startswith("__")}
        return found


def used_types(infra: Path) -> set[tuple[str, str]]:
    """Every (kind, type) named by a resource or data block under ``infra``."""
    used: set[tuple[str, str]] = set()
    directories = {p.parent for p in infra.rglob("*.tf") if ".terraform" not in p.parts}
    for directory in sorted(directories):
        for block in Config(directory).blocks():
            used.add((block.kind, block.type_name))
    return used


# --- the schema cache --------------------------------------------------------------------------

class Schema:
    """provider_schema.json: provider -> version -> {provider, resources, data_sources}."""

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("format") != SCHEMA_FORMAT:
            raise ValueError(f"provider_schema.json has format {data.get('format')!r}, expected "
                             f"{SCHEMA_FORMAT}; regenerate it: {REGENERATE}")
        self.data = data

    @classmethod
    def load(cls, path: Path = CACHE) -> Schema:
        return cls(json.loads(path.read_text()))

    def versions(self, provider: str) -> dict[str, dict[str, Any]]:
        try:
            return self.data["providers"][provider]["versions"]
        except KeyError:
            raise SchemaCacheMissing(
                f"provider {provider!r} is not in tests/infra/provider_schema.json; add its "
                f"@cdktf/provider-* package to DEFAULT_PACKAGES in "
                f"tests/infra/extract_provider_schema.py and run: {REGENERATE}") from None

    def source(self, provider: str) -> str:
        return self.data["providers"][provider]["source"]

    def type_schema(self, provider: str, version: str, kind: str,
                    type_name: str) -> dict[str, Any] | None:
        """The schema of a type; None if the provider has no such type."""
        table = self.versions(provider)[version]["data_sources" if kind == "data" else "resources"]
        if type_name not in table:
            raise SchemaCacheMissing(
                f"{'data source' if kind == 'data' else 'resource'} type {type_name} is not in "
                f"tests/infra/provider_schema.json (it holds only the types infra/ used when it "
                f"was extracted); regenerate it: {REGENERATE}")
        return table[type_name]

    def having(self, kind: str, type_name: str) -> list[str]:
        """"provider version" of every cached schema that has the type."""
        table = "data_sources" if kind == "data" else "resources"
        return [f"{provider} {version}"
                for provider, entry in sorted(self.data["providers"].items())
                for version, schemas in sorted(entry["versions"].items())
                if schemas[table].get(type_name)]

    def elsewhere(self, kind: str, type_name: str, block_path: list[str],
                  name: str) -> list[str]:
        """"provider version" of every cached schema where ``name`` exists at ``block_path``
        of ``type_name`` (for hints)."""
        where = []
        for provider, entry in sorted(self.data["providers"].items()):
            for version in sorted(entry["versions"]):
                table = entry["versions"][version][
                    "data_sources" if kind == "data" else "resources"]
                schema = table.get(type_name)
                for step in block_path:
                    schema = (schema or {}).get("blocks", {}).get(step)
                if schema and (name in schema["arguments"] or name in schema["blocks"]):
                    where.append(f"{provider} {version}")
        return where


# --- checks ------------------------------------------------------------------------------------

def _check_body(body: dict[str, Any], schema: dict[str, Any], where: str, *,
                meta_arguments: set[str], meta_blocks: set[str],
                hint: Any) -> list[str]:
    """Errors of one block body against its schema (recursively)."""
    errors: list[str] = []
    arguments, blocks = schema["arguments"], schema["blocks"]
    static_blocks: dict[str, int] = {}
    dynamic_blocks: set[str] = set()
    for key, value in body.items():
        if key.startswith("__") or key in meta_arguments or key in meta_blocks:
            continue
        if key == "dynamic":
            for entry in value:
                for label, dynamic in entry.items():
                    label = _unquote(label)
                    inner = f"{where} > dynamic \"{label}\""
                    if label not in blocks:
                        kind = "an argument" if label in arguments else "not a block"
                        errors.append(f"{inner}: `{label}` is {kind} here{hint([], label)}")
                        continue
                    dynamic_blocks.add(label)
                    for extra in set(dynamic) - DYNAMIC_ARGUMENTS - {"content"}:
                        if not extra.startswith("__"):
                            errors.append(f"{inner}: `{extra}` is not an argument of dynamic")
                    contents = dynamic.get("content", [])
                    if len(contents) != 1:
                        errors.append(f"{inner}: needs exactly one content block")
                    for content in contents:
                        errors += _check_body(
                            content, blocks[label], f"{inner} > content",
                            meta_arguments=set(), meta_blocks=set(),
                            hint=lambda p, n, label=label: hint([label, *p], n))
            continue
        if _is_block_list(value):
            if key in blocks:
                static_blocks[key] = static_blocks.get(key, 0) + len(value)
                for item in value:
                    errors += _check_body(
                        item, blocks[key], f"{where} > {key}",
                        meta_arguments=set(), meta_blocks=set(),
                        hint=lambda p, n, key=key: hint([key, *p], n))
            elif key in arguments:
                errors.append(f"{where}: `{key}` is an argument: write `{key} = ...`, "
                              f"not a `{key} {{ }}` block")
            else:
                errors.append(f"{where}: unsupported block `{key}`{hint([], key)}")
            continue
        if key in arguments:
            continue
        if key in blocks:
            errors.append(f"{where}: `{key}` is a block: write `{key} {{ ... }}`, "
                          f"not `{key} = ...`")
        else:
            readonly = key in schema.get("attributes", [])
            reason = " (a read-only attribute)" if readonly else ""
            errors.append(f"{where}: unsupported argument `{key}`{reason}{hint([], key)}")
    for name, need in arguments.items():
        if need == "required" and name not in body:
            errors.append(f"{where}: required argument `{name}` is missing")
    for name, block in blocks.items():
        count = static_blocks.get(name, 0)
        if block["required"] and count == 0 and name not in dynamic_blocks:
            errors.append(f"{where}: required block `{name}` is missing")
        if block["max_one"] and (count > 1 or (count and name in dynamic_blocks)):
            errors.append(f"{where}: block `{name}` may appear only once")
    return errors


def check_config(config: Config, schema: Schema) -> list[str]:
    """Every schema error in one configuration directory, against every cached version."""
    errors: list[str] = []
    declared = {(b.kind, b.type_name, b.name) for b in config.blocks()}
    for block in config.blocks():
        where_file = _display(block.path)
        for version in sorted(schema.versions(block.provider)):
            label = f"{schema.source(block.provider)} {version}"
            where = f"{where_file}: {block.address} [{label}]"
            type_schema = schema.type_schema(block.provider, version, block.kind, block.type_name)
            if type_schema is None:
                others = schema.having(block.kind, block.type_name)
                also = f" (it is in: {', '.join(others)})" if others else ""
                errors.append(f"{where}: {label} has no {block.kind} type "
                              f"{block.type_name}{also}")
                continue

            def hint(path: list[str], name: str, block: Block = block, label: str = label) -> str:
                others = [w for w in schema.elsewhere(block.kind, block.type_name, path, name)
                          if w.split()[0] != block.provider]
                return f" (it exists in: {', '.join(others)})" if others else ""

            meta_blocks = DATA_META_BLOCKS if block.kind == "data" else RESOURCE_META_BLOCKS
            errors += _check_body(block.body, type_schema, where,
                                  meta_arguments=RESOURCE_META_ARGUMENTS,
                                  meta_blocks=meta_blocks, hint=hint)
            errors += _check_lifecycle(block, type_schema, where)
        errors += _check_depends_on(block, declared, config)
    errors += _check_references(config, schema, declared)
    return errors


def _check_lifecycle(block: Block, type_schema: dict[str, Any], where: str) -> list[str]:
    errors = []
    for lifecycle in block.body.get("lifecycle", []):
        for entry in lifecycle.get("ignore_changes", []) or []:
            text = _expression(entry)
            if text == "all":
                continue
            name = re.match(r"[a-z0-9_]+", text)
            if name is None or name.group(0) not in type_schema["attributes"]:
                errors.append(f"{where}: lifecycle.ignore_changes names `{text}`, which is not "
                              f"an attribute of {block.type_name}")
    return errors


def _check_depends_on(block: Block, declared: set[tuple[str, str, str]],
                      config: Config) -> list[str]:
    errors = []
    for entry in block.body.get("depends_on", []) or []:
        text = _expression(entry)
        parts = text.split(".")
        if parts[0] == "module":
            continue
        kind = "data" if parts[0] == "data" else "resource"
        parts = parts[1:] if kind == "data" else parts
        if len(parts) != 2 or (kind, parts[0], re.sub(r"\[.*", "", parts[1])) not in declared:
            errors.append(f"{block.path.name}: {block.address}: depends_on names `{text}`, "
                          f"which is not declared in {config.directory.name}/")
    return errors


def _check_references(config: Config, schema: Schema,
                      declared: set[tuple[str, str, str]]) -> list[str]:
    """``type.name.attribute`` references to resources and data sources."""
    errors = []
    declared_types = {(k, t) for k, t, _n in declared}
    providers = {b.address: b.provider for b in config.blocks()}
    for path, parsed in config.files.items():
        for text in _strings(parsed):
            for data, type_name, name, attribute in _REFERENCE.findall(text):
                kind = "data" if data else "resource"
                if (kind, type_name) not in declared_types:
                    continue
                address = f"{data}{type_name}.{name}"
                if (kind, type_name, name) not in declared:
                    errors.append(f"{path.name}: reference to undeclared {address}")
                    continue
                provider = providers[address]
                for version in schema.versions(provider):
                    type_schema = schema.type_schema(provider, version, kind, type_name)
                    if type_schema and attribute not in type_schema["attributes"]:
                        errors.append(f"{path.name}: {address}.{attribute}: {type_name} has no "
                                      f"attribute `{attribute}` in {schema.source(provider)} "
                                      f"{version}")
    return sorted(set(errors))


def check_providers(config: Config, schema: Schema) -> list[str]:
    """``provider "x" { ... }`` blocks against the provider's configuration schema."""
    errors = []
    for path, name, body in config.providers():
        for version, entry in sorted(schema.versions(name).items()):
            where = f"{path.name}: provider \"{name}\" [{schema.source(name)} {version}]"
            errors += _check_body(body, entry["provider"], where,
                                  meta_arguments=PROVIDER_META_ARGUMENTS, meta_blocks=set(),
                                  hint=lambda p, n: "")
    return errors


def check_module_calls(config: Config) -> list[str]:
    """Module calls with a local source against the called module's variables and outputs."""
    errors = []
    for path, name, body in config.modules():
        source = _unquote(str(body.get("source", "")))
        if not source.startswith((".", "/")):
            continue
        called = Config((config.directory / source).resolve())
        variables = called.variables()
        meta = {"source", "version", "count", "for_each", "providers", "depends_on"}
        for key in body:
            if not key.startswith("__") and key not in meta and key not in variables:
                errors.append(f"{path.name}: module.{name}: `{key}` is not a variable of {source}")
        for variable, spec in variables.items():
            if "default" not in spec and variable not in body:
                errors.append(f"{path.name}: module.{name}: required variable `{variable}` "
                              f"is not set")
        outputs = called.outputs()
        for file_path, parsed in config.files.items():
            for text in _strings(parsed):
                for output in re.findall(rf"\bmodule\.{re.escape(name)}\.(\w+)", text):
                    if output not in outputs:
                        errors.append(f"{file_path.name}: module.{name}.{output}: {source} has "
                                      f"no output `{output}`")
    return errors


# --- version constraints -----------------------------------------------------------------------

def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.strip().split("-")[0].split("."))


def satisfies(version: str, constraint: str) -> bool:
    """Whether ``version`` meets a Terraform version constraint such as ">= 6.47, < 7.0"."""
    have = _version_tuple(version)
    for clause in constraint.split(","):
        match = re.fullmatch(r"\s*(>=|<=|!=|~>|>|<|=)?\s*([0-9][0-9.]*)\s*", clause)
        if match is None:
            raise ValueError(f"cannot read version constraint {constraint!r}")
        operator, wanted_text = match.group(1) or "=", match.group(2)
        wanted = _version_tuple(wanted_text)
        width = max(len(have), len(wanted))
        a = have + (0,) * (width - len(have))
        b = wanted + (0,) * (width - len(wanted))
        if operator == "~>":
            upper = list(wanted[:-1]) if len(wanted) > 1 else list(wanted)
            upper[-1] += 1
            ok = a >= b and have[:len(upper)] < tuple(upper)
        else:
            ok = {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "=": a == b,
                  "!=": a != b}[operator]
        if not ok:
            return False
    return True
