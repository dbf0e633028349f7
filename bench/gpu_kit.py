"""The GPU kit: the wheels a lent GPU machine lacks for `bench/gpu_session.py`, built here, installed there.

The device image has Python 3.12, torch, transformers, nvidia-ml-py, numpy, pandas, scikit-learn,
click, rich, matplotlib, tensorboard, pyyaml, safetensors and pyarrow (and what those need), no
network, and at most 64 MiB of files travel with the working tree. So `make gpu-kit` downloads, on
this machine, exactly the wheels the session imports that the image lacks (`KIT`, no dependencies:
each needed one is named), pinned to the versions this checkout's tests run with, plus a wheel of
hetprof itself (its stage folders only import once installed), and refuses a kit that would not fit.
What the project requires but the session never imports stays out (`LEFT_OUT`, with the reason).
`bench/gpu_session.py` installs the kit into a private folder and checks every version against
pyproject.toml before anything runs.

    .venv/bin/python bench/gpu_kit.py --kit .gpukit      # what `make gpu-kit` runs
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "hetprof"

# What the session imports that the device image lacks (found by running its paths with these absent).
KIT: dict[str, str] = {
    "optuna": "`hetprof plan`'s default search (hetrl) keeps its arms in an Optuna study",
    "colorlog": "imported by optuna at import time (its logging)",
}
# What pyproject.toml (or a kit package) requires that no path of the session imports.
LEFT_OUT: dict[str, str] = {
    "pulp": "the ILP searches; a one-GPU plan's few layouts are enumerated (PuLP bundles 16 MB of CBC)",
    "sqlalchemy": "optuna's RDB storage, used only with `hetprof plan --storage`",
    "alembic": "optuna's RDB storage, used only with `hetprof plan --storage`",
    "datasets": "prompt files (`hetprof run --prompts`); the session uses the built-in prompts",
    "math-verify": "the `math` reward; the session uses the `arithmetic` reward",
}
# The device's interpreter and platform (pip download's cross-platform flags).
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64")
MAX_TRAVEL_MIB = 60  # kit + project; the device tool carries at most 64 MiB


class KitError(Exception):
    """A kit that cannot serve the session; the message is one line naming the package."""


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    """`name==version` of every kit package, as installed next to this interpreter (what the tests use)."""
    out = []
    for name in KIT:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            raise KitError(f"gpu kit: {name} is not installed here to pin its version (run `make install`)") from None
    return out


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def build(kit: Path, repo: Path = ROOT) -> list[Path]:
    """Download the kit's wheels and build hetprof's into `kit` (emptied first); the wheels."""
    shutil.rmtree(kit, ignore_errors=True)
    kit.mkdir(parents=True)
    platform = [flag for p in PLATFORMS for flag in ("--platform", p)]
    _pip("download", "--quiet", "--only-binary=:all:", "--python-version", PYTHON_VERSION, *platform,
         "--no-deps", "--dest", str(kit), *pins())
    _pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(kit), str(repo))
    return sorted(kit.glob("*.whl"))


def travelling_bytes(repo: Path, kit: Path) -> int:
    """Bytes that go to the device: tracked and untracked-but-not-ignored files, plus the kit."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    files = {repo / name for name in listed if name and (repo / name).is_file()}
    return sum(f.stat().st_size for f in files) + sum(f.stat().st_size for f in kit.rglob("*") if f.is_file())


def check_size(repo: Path, kit: Path, limit_mib: float = MAX_TRAVEL_MIB) -> float:
    """MiB of kit plus project; a KitError when over `limit_mib`."""
    mib = travelling_bytes(repo, kit) / 2**20
    if mib > limit_mib:
        raise KitError(f"gpu kit: kit + project are {mib:.1f} MiB, over the {limit_mib} MiB that may travel")
    return mib


# ---- on the device ----------------------------------------------------------------------------

def wheels_needed(kit: Path) -> dict[str, Path]:
    """The kit's wheel for each package the session needs (KIT and hetprof); a KitError names the first
    one missing."""
    found = {normalise(w.name.split("-")[0]): w for w in kit.glob("*.whl")}
    out = {}
    for name in [*KIT, PROJECT]:
        wheel = found.get(normalise(name))
        if wheel is None:
            raise KitError(f"gpu kit: no wheel for {name} in {kit} (run `make gpu-kit` and carry {kit.name})")
        out[name] = wheel
    return out


def install(kit: Path, target: Path) -> str:
    """Install the session's wheels from `kit` into `target` (no index, no dependencies); how it was done.
    Without pip a wheel is unzipped, which installs a wheel whose files all go to site-packages (these do)."""
    wheels = wheels_needed(kit)
    target.mkdir(parents=True, exist_ok=True)
    has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if has_pip:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                               "--disable-pip-version-check", "--target", str(target), *map(str, wheels.values())],
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise KitError(f"gpu kit: pip could not install the kit into {target}: {last}")
        return "pip install --no-index --no-deps --target"
    for wheel in wheels.values():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
    return "unzipped (no pip)"


def requirements(pyproject: Path) -> list[str]:
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def check_versions(pyproject: Path, path: list[str]) -> list[dict]:
    """Each requirement of pyproject.toml and each kit package: the version found on `path` and whether
    pyproject accepts it. A KitError (one line, naming the package) for a needed package that is
    absent or at a version pyproject refuses; a LEFT_OUT package may be absent."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    reqs = {normalise(r.name): r for r in map(Requirement, requirements(pyproject))}
    rows = []
    for name in dict.fromkeys([*reqs, *map(normalise, KIT)]):
        req = reqs.get(name)
        spec = str(req.specifier) if req is not None else ""
        dist = next(iter(metadata.distributions(name=name, path=path)), None)
        if dist is None:
            why = LEFT_OUT.get(name)
            if why is None:
                raise KitError(f"gpu kit: {name} {spec} is missing (neither on this machine nor in the kit)")
            rows.append({"package": name, "required": spec, "found": None, "note": f"absent: {why}"})
            continue
        version = dist.version
        if req is not None and not req.specifier.contains(Version(version), prereleases=True):
            raise KitError(f"gpu kit: {name} {version} is outside what pyproject.toml accepts ({spec})")
        rows.append({"package": name, "required": spec, "found": version,
                     "note": "kit package" if name in map(normalise, KIT) else ""})
    return rows


def _record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def source_dir(package: str, package_dir: dict[str, str]) -> Path | None:
    """The working-tree folder of an installed package, by pyproject's package-dir (longest prefix)."""
    for prefix in sorted(package_dir, key=len, reverse=True):
        if package == prefix or package.startswith(prefix + "."):
            return Path(package_dir[prefix], *package[len(prefix):].split(".")[1:])
    return None


def stale_sources(dist: metadata.Distribution, repo: Path, pyproject: Path) -> list[str]:
    """Files of the working tree that differ from the installed hetprof wheel's, and modules it lacks:
    a kit built before the last edit would run old code on the device."""
    setup = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    package_dir = setup["package-dir"]
    installed: dict[Path, str] = {}
    for f in dist.files or []:
        folder = source_dir(".".join(f.parts[:-1]), package_dir)
        if folder is not None and f.hash is not None:
            installed[repo / folder / f.name] = f"{f.hash.mode}={f.hash.value}"
    stale = [p for p, h in installed.items() if not p.is_file() or _record_hash(p) != h]
    for package in setup["packages"]:
        stale += [p for p in sorted((repo / source_dir(package, package_dir)).glob("*.py")) if p not in installed]
    return sorted(str(p.relative_to(repo)) for p in stale)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", type=Path, default=ROOT / ".gpukit", help="folder to fill (emptied first)")
    args = parser.parse_args(argv)
    try:
        wheels = build(args.kit.resolve())
        mib = check_size(ROOT, args.kit.resolve())
    except KitError as exc:
        sys.exit(str(exc))
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:7.2f} MiB  {w.name}")
    kit_mib = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"kit {kit_mib:.2f} MiB; kit + project {mib:.2f} MiB of the {MAX_TRAVEL_MIB} MiB allowed")
    print("left out (not on the session's paths): " + "; ".join(f"{k}: {v}" for k, v in LEFT_OUT.items()))


if __name__ == "__main__":
    main()
