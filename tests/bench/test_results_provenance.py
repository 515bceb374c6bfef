"""Every committed result can be traced to the code, host and command that made it
(bench/provenance.py writes these fields), and names nothing a reader cannot rebuild: no
scratch folder of the machine a run was made on.

A result JSON carries `command`, `commit` (a commit of this repository), `dirty` (whether the
code differed from it) and `machine` (the host). A JSON beside a `stamp.json` may leave them
to that file (bench abuse writes one stamp for its rounds). JSON written before these fields
existed was backfilled from git history and says so in `provenance_backfilled`; only such a
file may give a field as null, and then names it in `provenance_unknown` with the reason."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
FIELDS = ("command", "commit", "dirty", "machine")
SCRATCH = re.compile(rb"/(?:var/)?tmp/")
SCRATCH_IN_NAME = re.compile(r"(?:^|_)(?:var_)?tmp_")
COMMIT = re.compile(r"[0-9a-f]{7,40}")


def field_problem(name: str, value: Any) -> str | None:
    """What is wrong with one provenance field's value, if anything."""
    if name == "dirty":
        return None if isinstance(value, bool) else f"dirty is {value!r}, not true/false"
    if not isinstance(value, str) or not value.strip():
        return f"{name} is {value!r}, not a non-empty string"
    if name == "commit" and not COMMIT.fullmatch(value):
        return f"commit {value!r} is not a commit id"
    return None


def problems(doc: Any, stamp: Any = None) -> list[str]:
    """Why `doc` (a result JSON; `stamp`: the stamp.json beside it, if any) does not name its
    provenance; empty when it does."""
    if not isinstance(doc, Mapping):
        return [f"a {type(doc).__name__}, not an object with its provenance"]
    if stamp is not None and not any(f in doc for f in FIELDS):
        return [f"stamp.json: {p}" for p in problems(stamp)]
    backfilled = doc.get("provenance_backfilled")
    unknown = doc.get("provenance_unknown", {})
    out = []
    if backfilled is not None and (not isinstance(backfilled, str) or not backfilled.strip()):
        out.append("provenance_backfilled must say how the fields were found")
    if unknown and backfilled is None:
        out.append("provenance_unknown is allowed only in a backfilled file")
    if not isinstance(unknown, Mapping):
        return [*out, "provenance_unknown must map a field to the reason it is unknown"]
    for name in FIELDS:
        if name not in doc:
            out.append(f"no {name}")
        elif doc[name] is None and name != "commit" and backfilled is not None:
            reason = unknown.get(name)
            if not isinstance(reason, str) or not reason.strip():
                out.append(f"{name} is null without a reason in provenance_unknown")
        elif (p := field_problem(name, doc[name])) is not None:
            out.append(p)
    return out


def result_folders() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_dir())


def jsons(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.json")) if folder.is_dir() else [folder]


def test_results_are_where_the_check_looks() -> None:
    """The walk below sees the committed results: an empty walk would pass everything."""
    assert len([p for f in result_folders() for p in jsons(f)]) > 100


@pytest.mark.parametrize("folder", [*result_folders(), *RESULTS.glob("*.json")],
                         ids=lambda p: p.name)
def test_every_result_names_its_commit_host_and_command(folder: Path) -> None:
    found = {}
    for path in jsons(folder):
        if path.name == "stamp.json":
            stamp = None
        else:
            beside = path.parent / "stamp.json"
            stamp = json.loads(beside.read_text()) if beside.exists() else None
        if p := problems(json.loads(path.read_text()), stamp):
            found[str(path.relative_to(RESULTS))] = p
    assert found == {}


def test_every_commit_named_by_a_result_is_in_this_history() -> None:
    """A commit id must be an ancestor of HEAD: one rebased away, mistyped or left on a side
    branch names nothing a clone of this branch can check out (a local clone still holds such
    objects, so resolving the id is not enough)."""
    commits = set()
    for path in RESULTS.rglob("*.json"):
        doc = json.loads(path.read_text())
        if isinstance(doc, Mapping) and isinstance(doc.get("commit"), str):
            commits.add(doc["commit"])
    assert commits
    outside = [c for c in sorted(commits)
               if subprocess.run(["git", "merge-base", "--is-ancestor", c, "HEAD"], cwd=ROOT,
                                 capture_output=True).returncode != 0]
    assert outside == []


def test_no_result_names_a_scratch_folder() -> None:
    """/tmp/... or /var/tmp/... of the host a run was made on cannot be rebuilt by a reader:
    an A/B against older code names its commit and the command that rebuilds it."""
    found = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*")
             if SCRATCH_IN_NAME.search(p.name) or (p.is_file() and SCRATCH.search(p.read_bytes()))]
    assert found == []


@pytest.mark.parametrize(("doc", "stamp", "wanted"), [
    ({"command": "c", "commit": "abc1234", "dirty": False, "machine": "m"}, None, []),
    ({"command": "c", "commit": "abc1234", "machine": "m"}, None, ["no dirty"]),
    ({"command": "c", "commit": "HEAD", "dirty": False, "machine": "m"}, None,
     ["commit 'HEAD' is not a commit id"]),
    ({"command": "c", "commit": "abc1234", "dirty": "no", "machine": "m"}, None,
     ["dirty is 'no', not true/false"]),
    # null only in a backfilled file, with its reason
    ({"command": "c", "commit": "abc1234", "dirty": None, "machine": "m"}, None,
     ["dirty is None, not true/false"]),
    ({"command": "c", "commit": "abc1234", "dirty": None, "machine": "m",
      "provenance_backfilled": "from git"}, None,
     ["dirty is null without a reason in provenance_unknown"]),
    ({"command": "c", "commit": "abc1234", "dirty": None, "machine": "m",
      "provenance_backfilled": "from git", "provenance_unknown": {"dirty": "why"}}, None, []),
    ({"command": "c", "commit": None, "dirty": False, "machine": "m",
      "provenance_backfilled": "from git", "provenance_unknown": {"commit": "why"}}, None,
     ["commit is None, not a non-empty string"]),
    ({"command": "c", "commit": "abc1234", "dirty": False, "machine": "m",
      "provenance_unknown": {"machine": "why"}}, None,
     ["provenance_unknown is allowed only in a backfilled file"]),
    # the folder's stamp speaks for a round's JSON that carries none of the fields
    ({"rounds": []}, {"command": "c", "commit": "abc1234", "dirty": True, "machine": "m"}, []),
    ({"rounds": []}, {"command": "c", "machine": "m"}, ["stamp.json: no commit",
                                                         "stamp.json: no dirty"]),
    ([1, 2], None, ["a list, not an object with its provenance"]),
])
def test_what_the_check_accepts(doc: Any, stamp: Any, wanted: list[str]) -> None:
    assert problems(doc, stamp) == wanted


def git_in(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_new_result_records_whether_the_code_differed_from_its_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/provenance.stamp in a real repository: a change to code makes the tree dirty, a
    result written under bench/results does not."""
    from bench.provenance import stamp

    (tmp_path / "router").mkdir()
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "router" / "policy.py").write_text("A = 1\n")
    git_in(tmp_path, "init", "-q")
    git_in(tmp_path, "add", "-A")
    git_in(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "c")
    monkeypatch.chdir(tmp_path)
    clean = stamp("python -m bench x")
    assert problems(clean) == [] and clean["dirty"] is False
    (tmp_path / "bench" / "results" / "point.json").write_text("{}\n")
    assert stamp("c")["dirty"] is False
    (tmp_path / "router" / "policy.py").write_text("A = 2\n")
    assert stamp("c")["dirty"] is True
    assert stamp("c")["version"] == clean["commit"] + " (modified)"
