"""Check the built distributions' metadata: what `twine check` does not know about this project.

Usage: check_dists.py DIST_DIR VERSION. Exits 1 naming every problem found.
"""

from __future__ import annotations

import email.parser
import sys
import tarfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

CORE = "pipeline-healthkit"
# distribution -> (import package, Python versions it claims, files its sdist must carry)
DISTS = {
    CORE: ("healthkit", ["3.10", "3.11", "3.12", "3.13"], ["LICENSE", "README.md", "CHANGELOG.md"]),
    "pipeline-healthkit-glt": ("healthkit_glt", ["3.11"], ["LICENSE", "README.md"]),
    "pipeline-healthkit-graphlearn": ("healthkit_graphlearn", ["3.11"], ["LICENSE", "README.md"]),
    "pipeline-healthkit-torch": ("healthkit_torch", ["3.11"], ["LICENSE", "README.md"]),
}
# pipeline-healthkit-torch never declares torch: the user's own build (CPU, CUDA, ROCm) stays.
TORCH_DIST = "pipeline-healthkit-torch"
# The unrelated PyPI project that owns the name; no distribution of ours may pull it in.
FOREIGN = canonicalize_name("healthkit")
# pipeline-healthkit-glt's stack is the user's to install first (docs/glt.md, "Supported
# versions"): never a plain dependency, and the `torch23` extra pins the tested PyPI stack.
GLT = "pipeline-healthkit-glt"
GLT_STACK = {"torch", "graphlearn-torch"}
GLT_EXTRA = {"torch": "==2.3.0", "graphlearn-torch": "==0.2.4"}


def check(dist_dir: Path, version: str) -> list[str]:
    problems: list[str] = []
    root = Path(__file__).resolve().parents[1]
    license_text = (root / "LICENSE").read_bytes()
    if f"## {version} " not in (root / "CHANGELOG.md").read_text() + " ":
        problems.append(f"CHANGELOG.md has no '## {version} ...' section")
    files = sorted(p.name for p in dist_dir.iterdir())
    for name, (package, pythons, sdist_files) in DISTS.items():
        stem = name.replace("-", "_")
        wheel = dist_dir / f"{stem}-{version}-py3-none-any.whl"
        sdist = dist_dir / f"{stem}-{version}.tar.gz"
        for p in (wheel, sdist):
            if not p.exists():
                problems.append(f"missing {p.name} (found: {', '.join(files)})")
        if not (wheel.exists() and sdist.exists()):
            continue
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            info = f"{stem}-{version}.dist-info"
            meta = email.parser.HeaderParser().parsestr(z.read(f"{info}/METADATA").decode())
            if z.read(f"{info}/licenses/LICENSE") != license_text:
                problems.append(f"{wheel.name}: licenses/LICENSE is not the repository's LICENSE")
            own = z.read(f"{package}/_version.py").decode()
            if f'__version__ = "{version}"' not in own:
                problems.append(f"{wheel.name}: {package}/_version.py does not say {version}")
            if name == CORE:
                entry = z.read(f"{info}/entry_points.txt").decode()
                if "healthkit = healthkit.__main__:main" not in entry:
                    problems.append(f"{wheel.name}: no `healthkit` console script")
        tops = {n.split("/")[0] for n in names} - {info}
        if tops != {package}:
            problems.append(f"{wheel.name}: top-level entries {sorted(tops)}, expected [{package}]")
        if f"{package}/py.typed" not in names:
            problems.append(f"{wheel.name}: no {package}/py.typed (the Typing :: Typed promise)")

        def expect(field: str, value: str, meta: email.message.Message = meta,
                   where: str = wheel.name) -> None:
            if meta.get(field) != value:
                problems.append(f"{where}: {field} is {meta.get(field)!r}, expected {value!r}")

        expect("Name", name)
        expect("Version", version)
        expect("License-Expression", "Apache-2.0")
        expect("License-File", "LICENSE")
        expect("Requires-Python", ">=3.10")
        expect("Description-Content-Type", "text/markdown")
        if Version(meta["Metadata-Version"]) < Version("2.4"):
            problems.append(f"{wheel.name}: Metadata-Version {meta['Metadata-Version']} < 2.4")
        if not (meta.get_payload() or "").strip():
            problems.append(f"{wheel.name}: empty long description (readme)")
        classifiers = set(meta.get_all("Classifier") or [])
        wanted = {"Operating System :: POSIX :: Linux", "Typing :: Typed"}
        wanted |= {f"Programming Language :: Python :: {v}" for v in pythons}
        for c in sorted(wanted - classifiers):
            problems.append(f"{wheel.name}: missing classifier {c!r}")
        if any(c.startswith("License ::") for c in classifiers):
            problems.append(f"{wheel.name}: a License classifier besides License-Expression")
        for line in meta.get_all("Requires-Dist") or []:
            req = Requirement(line)
            if canonicalize_name(req.name) == FOREIGN:
                problems.append(f"{wheel.name}: depends on PyPI's unrelated `healthkit`: {line}")
            if canonicalize_name(req.name) == CORE and not req.specifier.contains(version):
                problems.append(f"{wheel.name}: {line} excludes the core of the same release")
        if name == GLT:
            reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
            plain = {canonicalize_name(r.name) for r in reqs if r.marker is None}
            for dep in sorted(GLT_STACK & plain):
                problems.append(f"{wheel.name}: {dep} is a plain dependency (docs/glt.md)")
            extra = {
                canonicalize_name(r.name): str(r.specifier)
                for r in reqs
                if r.marker is not None and r.marker.evaluate({"extra": "torch23"})
            }
            for dep, spec in GLT_EXTRA.items():
                if extra.get(dep) != spec:
                    problems.append(f"{wheel.name}: [torch23] has {dep}{extra.get(dep)}, "
                                    f"expected {dep}{spec}")
        if name == TORCH_DIST:
            deps = {canonicalize_name(Requirement(r).name)
                    for r in meta.get_all("Requires-Dist") or []}
            if "torch" in deps:
                problems.append(f"{wheel.name}: declares torch (docs/dataloader.md: the user's)")
        if name != CORE and not any(
            canonicalize_name(Requirement(r).name) == CORE for r in meta.get_all("Requires-Dist")
        ):
            problems.append(f"{wheel.name}: does not depend on {CORE}")

        with tarfile.open(sdist) as t:
            members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
            links = [m.name for m in t.getmembers() if m.issym() or m.islnk()]
        for f in sdist_files:
            if f not in members:
                problems.append(f"{sdist.name}: no {f}")
        if links:  # symlinks in the tree (LICENSE, _version.py) must arrive as plain files
            problems.append(f"{sdist.name}: links instead of files: {links}")
    return problems


def main() -> int:
    dist_dir, version = Path(sys.argv[1]), sys.argv[2]
    problems = check(dist_dir, version)
    for p in problems:
        print(f"check_dists: {p}", file=sys.stderr)
    if not problems:
        print(f"check_dists: {len(DISTS)} distributions of {version}: metadata as promised")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
