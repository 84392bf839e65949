"""The DuckDB queries in docs/format.md run, as written, on the DuckDB the test extra installs;
the docs link only to files of this repository."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.store import LocalStore

FORMAT_MD = Path(__file__).resolve().parents[1] / "docs" / "format.md"
DOC_PREFIX = "/data/ckpt/checkpoints/ck-7/components/agent/agent-0"


def _duckdb_queries() -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", FORMAT_MD.read_text(), flags=re.S)
    return [b for b in blocks if b.lstrip().startswith("-- DuckDB")]


def test_the_duckdb_queries_of_the_format_spec_run(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    dep = DemoDeployment(str(root))
    dep.populate(20)
    cid = dep.checkpoint("ck-7").checkpoint_id
    dep.close()
    prefix = root / "checkpoints" / cid / "components" / "agent" / "agent-0"
    assert prefix.is_dir()
    boundaries = sorted(
        (m.rollout_id, m.revision, (m.refs or {}).get("model_call"))
        for m in ArchiveReader.open(LocalStore(root), f"checkpoints/{cid}/components/agent/agent-0").members(
            "agent_boundary"
        )
    )
    queries = _duckdb_queries()
    assert len(queries) >= 3
    con = duckdb.connect()
    results = [con.sql(q.replace(DOC_PREFIX, str(prefix))).fetchall() for q in queries]
    assert results[0] == []  # the demo has no attempt 1 yet: the filter query runs, finds none
    # payload fields decoded from the BLOB column
    assert [(r[0], r[2]) for r in results[1]] == [(b[0], b[1]) for b in boundaries]
    assert {r[3] for r in results[1]} == {b[2] for b in boundaries}
    # the member index: references without payloads
    assert sorted((r[1], r[5]) for r in results[2] if r[0] == "agent_boundary") == [
        (b[0], b[2]) for b in boundaries
    ]


def test_docs_link_only_inside_the_repository() -> None:
    """Every relative link of README.md and docs/*.md resolves to a file of this repository."""
    root = FORMAT_MD.parents[1]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = page.read_text()
        assert "../shared" not in text, page
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(root) and resolved.exists(), (page.name, target)
