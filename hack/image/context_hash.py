"""Print a hash of the build context the Dockerfile's COPY lines use (hack/image/build.sh).

The files are those under the COPY sources (not `COPY --from`), less what .dockerignore
excludes (its patterns as fnmatch globs, matched against the path and each of its parent
directories, `**/` matching any depth), hashed with their paths. A change to any file the
image is built from changes the hash; a new __pycache__ or benchmark result does not.

    python3 hack/image/context_hash.py REPO
"""

from __future__ import annotations

import fnmatch
import hashlib
import shlex
import sys
from pathlib import Path


def copy_sources(dockerfile: str) -> list[str]:
    text = dockerfile.replace("\\\n", " ")
    sources: list[str] = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "COPY":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]) or len(args) < 2:
            continue
        sources += args[:-1]
    return sources


def ignore_patterns(repo: Path) -> list[str]:
    path = repo / ".dockerignore"
    if not path.exists():
        return []
    lines = (ln.strip() for ln in path.read_text().splitlines())
    return [ln.rstrip("/") for ln in lines if ln and not ln.startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        bare = pat[3:] if pat.startswith("**/") else None
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, pat):
                return True
            if bare is not None and fnmatch.fnmatchcase(prefix.rsplit("/", 1)[-1], bare):
                return True
    return False


def context_hash(repo: Path) -> str:
    patterns = ignore_patterns(repo)
    files: set[Path] = set()
    for src in copy_sources((repo / "Dockerfile").read_text()):
        root = repo / src
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        files.update(p for p in candidates if p.is_file())
    digest = hashlib.sha256()
    for path in sorted(files):
        rel = path.relative_to(repo).as_posix()
        if ignored(rel, patterns):
            continue
        digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    print(context_hash(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()))
