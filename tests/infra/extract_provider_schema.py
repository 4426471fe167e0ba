"""Extract the provider schema that infra/ uses from the prebuilt CDK for Terraform bindings.

``terraform validate`` needs the provider plugins, which cannot be downloaded offline. The npm
registry, though, serves ``@cdktf/provider-google`` and ``@cdktf/provider-google-beta``, generated
from the providers' own schema (16.12.1 from 6.50.0, 16.9.0 from 6.47.0), and
``@cdktf/provider-time``. Their ``lib/<resource>/index.d.ts`` names every argument of every
resource and nested block (optional ones end in ``?``; a nested block typed ``X[]`` may repeat,
one typed ``X`` may appear once) and ``index.js`` says which names are blocks (``isBlock``) and
which attributes can be read (``getStringAttribute('uri')``...).

This script writes the part of that schema infra/ uses (the providers' configuration and every
resource and data source type that any .tf file under infra/ names) to
``tests/infra/provider_schema.json``, which tests/infra/test_provider_schema.py checks infra/
against. Run it again after using a new resource type or changing a provider pin:

    .venv/bin/python tests/infra/extract_provider_schema.py

It runs ``npm pack`` for the packages in DEFAULT_PACKAGES (needs npm and the npm registry) or,
given paths, reads already unpacked packages (directories holding package.json and lib/).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from tests.infra.provider_schema import (  # noqa: E402
    CACHE,
    REGENERATE,
    SCHEMA_FORMAT,
    used_types,
)

# Both ends of the pinned google / google-beta range (">= 6.47, < 7.0": 6.47.0 ... 6.50.0, the
# last 6.x release), and the time provider (time_sleep).
DEFAULT_PACKAGES = [
    "@cdktf/provider-google@16.12.1",       # hashicorp/google 6.50.0
    "@cdktf/provider-google@16.9.0",        # hashicorp/google 6.47.0
    "@cdktf/provider-google-beta@16.12.1",  # hashicorp/google-beta 6.50.0
    "@cdktf/provider-google-beta@16.9.0",   # hashicorp/google-beta 6.47.0
    "@cdktf/provider-time@11.0.1",          # hashicorp/time 0.13.1
]

_PROPERTY = re.compile(
    r"/\*\*(?P<doc>(?:(?!\*/).)*)\*/\s*readonly\s+(?P<name>\w+)(?P<optional>\?)?:\s*",
    re.DOTALL)
_INTERFACE = re.compile(r"^export interface (\w+)(?: extends [\w.]+)? \{\n(.*?)^\}", re.M | re.S)
_HCL_ATTR = re.compile(r'^\s*"?([a-z0-9_]+)"?: \{\s*\n\s*value: [^\n]*\n\s*isBlock: (true|false)',
                       re.M)
_READABLE = re.compile(r"""(?:get\w*Attribute|interpolationForAttribute)\(['"]([a-z0-9_]+)['"]\)"""
                       r"""|\(this, "([a-z0-9_]+)\"""")


def _type_text(text: str, start: int) -> str:
    """The TypeScript type starting at ``start``, up to the ``;`` that ends the property."""
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char in "{(<[":
            depth += 1
        elif char in "})>]":
            depth -= 1
        elif char == ";" and depth == 0:
            return text[start:index].strip()
    raise ValueError(f"unterminated type at {start}")


def _tf_name(doc: str, ts_name: str) -> str:
    """The Terraform name of a property: the anchor of its registry link, else snake_case."""
    match = re.search(r"\{@link \S+#([a-z0-9_]+) ", doc)
    if match:
        return match.group(1)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", ts_name).lower()


class Package:
    """One unpacked @cdktf/provider-* package."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        meta = json.loads((directory / "package.json").read_text())
        self.package = f"{meta['name']}@{meta['version']}"
        provider = meta["cdktf"]["provider"]
        self.source = provider["name"].removeprefix("registry.terraform.io/")
        self.provider_name = self.source.split("/")[-1]
        self.provider_version = provider["version"]
        self._index: dict[tuple[str, str], Path] | None = None

    def _lib_dir(self, kind: str, type_name: str) -> Path | None:
        """The lib/ directory of a resource or data source type (None if the provider has no
        such type)."""
        if kind == "provider":
            return self.directory / "lib" / "provider"
        short = type_name.removeprefix(f"{self.provider_name}_")
        guess = (f"data-{type_name}" if kind == "data" else short).replace("_", "-")
        candidate = self.directory / "lib" / guess
        if candidate.is_dir() and self._declares(candidate, kind, type_name):
            return candidate
        return self.index().get((kind, type_name))

    @staticmethod
    def _declares(directory: Path, kind: str, type_name: str) -> bool:
        text = (directory / "index.d.ts").read_text()
        base = "TerraformDataSource" if kind == "data" else "TerraformResource"
        return (f'tfResourceType = "{type_name}"' in text
                and f"extends cdktf.{base}" in text)

    def index(self) -> dict[tuple[str, str], Path]:
        """Every (kind, type) of the package (slow: reads every lib/*/index.d.ts)."""
        if self._index is None:
            self._index = {}
            for dts in sorted((self.directory / "lib").glob("*/index.d.ts")):
                text = dts.read_text()
                for base, kind in (("TerraformResource", "resource"),
                                   ("TerraformDataSource", "data")):
                    if f"extends cdktf.{base}" in text:
                        match = re.search(r'tfResourceType = "([a-z0-9_]+)"', text)
                        if match:
                            self._index[(kind, match.group(1))] = dts.parent
        return self._index

    def schema(self, kind: str, type_name: str) -> dict[str, Any] | None:
        directory = self._lib_dir(kind, type_name)
        if directory is None:
            return None
        return _Module(directory).root_schema()


class _Module:
    """lib/<type>/index.d.ts and index.js of one resource, data source or provider."""

    def __init__(self, directory: Path) -> None:
        self.dts = (directory / "index.d.ts").read_text()
        self.js = (directory / "index.js").read_text()
        self.interfaces = {name: body for name, body in _INTERFACE.findall(self.dts)}
        match = re.search(
            r"export declare class (\w+) extends cdktf\.Terraform(?:Resource|DataSource|Provider)",
            self.dts)
        if match is None:
            raise ValueError(f"no resource class in {directory}")
        self.class_name = match.group(1)

    def _hcl_kinds(self, interface: str) -> dict[str, bool]:
        """Terraform name -> isBlock, from the generated HCL serializer of an interface."""
        if interface.endswith("Config") and interface[:-6] == self.class_name:
            start = self.js.index(f"class {self.class_name} extends")
            start = self.js.index("synthesizeHclAttributes() {", start)
            end = self.js.index("\n    }\n", start)
        else:
            function = interface[0].lower() + interface[1:] + "ToHclTerraform"
            start = self.js.index(f"function {function}(struct) {{")
            end = self.js.index("\n}\n", start)
        return {name: flag == "true" for name, flag in _HCL_ATTR.findall(self.js[start:end])}

    def block_schema(self, interface: str) -> dict[str, Any]:
        body = self.interfaces[interface]
        kinds = self._hcl_kinds(interface)
        arguments: dict[str, str] = {}
        blocks: dict[str, Any] = {}
        for match in _PROPERTY.finditer(body):
            ts_type = _type_text(body, match.end())
            name = _tf_name(match.group("doc"), match.group("name"))
            required = match.group("optional") is None
            nested = next((t for t in re.findall(r"\b([A-Z]\w+)\b", ts_type)
                           if t in self.interfaces), None)
            if name not in kinds:
                raise ValueError(f"{interface}.{name} is not in the HCL serializer")
            if kinds[name]:
                if nested is None:
                    raise ValueError(f"block {interface}.{name} has no interface: {ts_type}")
                blocks[name] = {
                    "required": required,
                    "max_one": not ts_type.split("|")[0].strip().endswith("[]"),
                    **self.block_schema(nested),
                }
            else:
                arguments[name] = "required" if required else "optional"
        missing = set(kinds) - set(arguments) - set(blocks)
        if missing:
            raise ValueError(f"{interface}: serializer names {sorted(missing)} not in the interface")
        return {"arguments": dict(sorted(arguments.items())), "blocks": dict(sorted(blocks.items()))}

    def readable(self) -> list[str]:
        """Top-level names a reference may read (arguments and computed attributes)."""
        start = self.js.index(f"class {self.class_name} extends")
        end = self.js.index(f"\nexports.{self.class_name} =", start)
        names = {a or b for a, b in _READABLE.findall(self.js[start:end])}
        return sorted(names)

    def root_schema(self) -> dict[str, Any]:
        schema = self.block_schema(f"{self.class_name}Config")
        schema["attributes"] = sorted(set(self.readable()) | set(schema["arguments"]) | {"id"})
        return schema


def _unpack(specs: list[str], workdir: Path) -> list[Path]:
    """``npm pack`` each spec into ``workdir`` and unpack it; returns the package directories."""
    directories = []
    for spec in specs:
        out = subprocess.run(["npm", "pack", "--silent", spec], cwd=workdir, check=True,
                             capture_output=True, text=True, timeout=900).stdout.split()
        tarball = workdir / out[-1]
        target = workdir / tarball.stem
        target.mkdir()
        with tarfile.open(tarball) as archive:
            archive.extractall(target, filter="data")
        tarball.unlink()
        directories.append(target / "package")
    return directories


def extract(package_dirs: list[Path], infra: Path) -> dict[str, Any]:
    used = used_types(infra)
    cache: dict[str, Any] = {
        "format": SCHEMA_FORMAT,
        "about": ("Schema of the Terraform providers infra/ uses, extracted from the prebuilt "
                  "CDK for Terraform bindings (npm @cdktf/provider-*), which are generated from "
                  "the providers' own schema. Only the provider configuration and the resource "
                  "and data source types infra/ names are kept; null means the provider has no "
                  "such type."),
        "regenerate": REGENERATE,
        "providers": {},
    }
    for directory in package_dirs:
        package = Package(directory)
        entry = cache["providers"].setdefault(
            package.provider_name, {"source": package.source, "versions": {}})
        resources: dict[str, Any] = {}
        data_sources: dict[str, Any] = {}
        # google-beta serves google_* types; time serves time_* types.
        prefix = package.provider_name.split("-")[0] + "_"
        for kind, type_name in sorted(used):
            if not type_name.startswith(prefix):
                continue
            target = data_sources if kind == "data" else resources
            target[type_name] = package.schema(kind, type_name)
        entry["versions"][package.provider_version] = {
            "package": package.package,
            "provider": package.schema("provider", package.provider_name),
            "resources": resources,
            "data_sources": data_sources,
        }
        print(f"{package.package}: {package.source} {package.provider_version}, "
              f"{sum(v is not None for v in resources.values())} resource and "
              f"{sum(v is not None for v in data_sources.values())} data source types")
    return cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*",
                        help="unpacked package directories, or npm specs to `npm pack` "
                             f"(default: {' '.join(DEFAULT_PACKAGES)})")
    parser.add_argument("--infra", type=Path, default=ROOT / "infra")
    parser.add_argument("--output", type=Path, default=CACHE)
    args = parser.parse_args(argv)
    specs = args.packages or DEFAULT_PACKAGES
    with tempfile.TemporaryDirectory(prefix="cdktf-") as tmp:
        dirs = [Path(s) for s in specs if Path(s).is_dir()]
        dirs += _unpack([s for s in specs if not Path(s).is_dir()], Path(tmp))
        cache = extract(dirs, args.infra)
    args.output.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
