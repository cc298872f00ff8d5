"""Pinned jars from Maven Central, cached outside the repo and verified before use.

Each jar set is a small POM under `stack/maven/<set>/` resolved with
`mvn dependency:copy-dependencies`; `stack/jars.lock` pins the exact file names and SHA-256 of
what that must produce, so a changed upstream artifact or a half-finished download is caught
before a JVM ever loads it. Run `python -m dispatch.stack.jars fetch` (bootstrap does).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dispatch.settings import PROJECT_ROOT, load_settings

MAVEN_DIR = PROJECT_ROOT / "stack" / "maven"
LOCK_FILE = PROJECT_ROOT / "stack" / "jars.lock"
JAR_SETS = ("broker", "spark", "s3", "s3proxy")
_VERIFIED_STAMP = ".verified"


class JarError(Exception):
    """The jars are missing, corrupt, or could not be fetched; the message says which."""


@dataclass(frozen=True)
class LockedJar:
    jar_set: str
    file_name: str
    sha256: str


def read_lock(lock_file: Path = LOCK_FILE) -> dict[str, list[LockedJar]]:
    """The pinned jars of each set, from `stack/jars.lock` (`<set> <file> <sha256>` per line)."""
    pinned: dict[str, list[LockedJar]] = {name: [] for name in JAR_SETS}
    for number, line in enumerate(lock_file.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3 or fields[0] not in pinned:
            raise JarError(f"{lock_file}:{number}: expected '<set> <file> <sha256>', got {line!r}")
        pinned[fields[0]].append(LockedJar(fields[0], fields[1], fields[2]))
    return pinned


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def set_dir(cache: Path, jar_set: str) -> Path:
    return cache / jar_set


def verify_set(folder: Path, pinned: list[LockedJar]) -> None:
    """Raise JarError unless `folder` holds exactly the pinned jars with their checksums."""
    present = {path.name for path in folder.glob("*.jar")}
    expected = {jar.file_name for jar in pinned}
    if missing := sorted(expected - present):
        raise JarError(f"{folder}: missing {', '.join(missing)}")
    if extra := sorted(present - expected):
        raise JarError(f"{folder}: unexpected {', '.join(extra)} (stack/jars.lock is out of date?)")
    for jar in pinned:
        if _sha256(folder / jar.file_name) != jar.sha256:
            raise JarError(f"{folder / jar.file_name}: SHA-256 differs from stack/jars.lock")


def jar_paths(jar_set: str, cache: Path | None = None) -> list[Path]:
    """The verified jars of one set, for a classpath. Cheap: full checksums run at fetch time."""
    folder = set_dir(cache or load_settings().jar_cache, jar_set)
    pinned = read_lock()[jar_set]
    if not (folder / _VERIFIED_STAMP).is_file():
        raise JarError(f"the {jar_set} jars are not in {folder}: run scripts/bootstrap.sh")
    paths = [folder / jar.file_name for jar in pinned]
    if missing := [path.name for path in paths if not path.is_file()]:
        raise JarError(f"{folder}: missing {', '.join(missing)}: run scripts/bootstrap.sh")
    return paths


def _run_maven(jar_set: str, output: Path, maven_repo: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarError(
            "Maven (mvn) is not installed: scripts/bootstrap.sh installs it with apt-get"
        )
    command = [
        mvn, "-B", "-q", "--strict-checksums",
        f"-Dmaven.repo.local={maven_repo}",
        "-f", str(MAVEN_DIR / jar_set / "pom.xml"),
        "dependency:copy-dependencies", f"-DoutputDirectory={output}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise JarError(f"mvn could not fetch the {jar_set} jars (network? disk?):\n{tail}")


def fetch(cache: Path, maven_repo: Path) -> None:
    """Fetch every jar set that is not already verified in the cache, then verify it."""
    pinned_sets = read_lock()
    for jar_set in JAR_SETS:
        folder = set_dir(cache, jar_set)
        stamp = folder / _VERIFIED_STAMP
        if stamp.is_file() and stamp.read_text() == LOCK_FILE.read_text():
            continue
        cache.mkdir(parents=True, exist_ok=True)
        # Resolve into a scratch folder and swap it in whole, so an interrupted fetch never
        # leaves a half-filled set that looks complete.
        with tempfile.TemporaryDirectory(dir=cache, prefix=f".{jar_set}-") as scratch:
            staged = Path(scratch) / jar_set
            _run_maven(jar_set, staged, maven_repo)
            verify_set(staged, pinned_sets[jar_set])
            (staged / _VERIFIED_STAMP).write_text(LOCK_FILE.read_text())
            if folder.exists():
                shutil.rmtree(folder)
            staged.rename(folder)
        print(f"{jar_set} jars: {len(pinned_sets[jar_set])} verified in {folder}")


def write_lock(cache: Path, maven_repo: Path) -> None:
    """Resolve every set afresh and pin what Maven produced (run after editing a POM)."""
    lines = ["# <set> <file> <sha256>: written by `python -m dispatch.stack.jars lock`"]
    with tempfile.TemporaryDirectory() as scratch:
        for jar_set in JAR_SETS:
            staged = Path(scratch) / jar_set
            _run_maven(jar_set, staged, maven_repo)
            for jar in sorted(staged.glob("*.jar")):
                lines.append(f"{jar_set} {jar.name} {_sha256(jar)}")
    LOCK_FILE.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatch.stack.jars")
    parser.add_argument("action", choices=["fetch", "lock", "verify"])
    action = parser.parse_args(argv).action
    settings = load_settings()
    try:
        if action == "fetch":
            fetch(settings.jar_cache, settings.maven_repo)
        elif action == "lock":
            write_lock(settings.jar_cache, settings.maven_repo)
        else:
            pinned_sets = read_lock()
            for jar_set in JAR_SETS:
                verify_set(set_dir(settings.jar_cache, jar_set), pinned_sets[jar_set])
    except JarError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
