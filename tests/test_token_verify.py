"""`verify` checks the reference token store's rows, not only its snapshot manifest."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rollout_checkpoint.cli import app
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.errors import CheckpointRejectedError, IntegrityError
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.store import LocalStore
from rollout_checkpoint.tokens import TokenSnapshotReceipt, verify_snapshot_data


def _demo(tmp_path: Path) -> tuple[Path, LocalStore]:
    root = tmp_path / "ckpt"
    deployment = DemoDeployment(LocalStore(root))
    deployment.populate(12)
    assert deployment.checkpoint().clean
    deployment.close()
    return root, LocalStore(root)


def _token_shards(root: Path) -> list[Path]:
    shards = sorted((root / "tokens" / "shards").glob("*.parquet"))
    assert shards, "the demo stages model-call tokens in the reference token store"
    return shards


def test_intact_token_data_verifies(tmp_path: Path) -> None:
    _root, store = _demo(tmp_path)
    plan = load_checkpoint(store)
    receipt = TokenSnapshotReceipt.model_validate(plan.record.token_snapshot)
    assert verify_snapshot_data(store, receipt) == receipt.entries > 0
    assert verify_checkpoint(store).checkpoint_id == plan.checkpoint_id


def _flip_token_data(data: bytes) -> bytes:
    """The shard with one byte flipped that changes the token data it decodes to (Parquet still
    parses). Verification checks every entry's digest, so a flip in bytes that decode to the same
    rows (page statistics, for one) changes nothing a reader uses; the shard's layout varies with
    its random ids, so a fixed offset sometimes hit such a byte."""
    original = pq.read_table(pa.BufferReader(data))
    for pos in range(len(data) // 3, len(data)):
        flipped = data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :]
        try:
            if not pq.read_table(pa.BufferReader(flipped)).equals(original):
                return flipped
        except Exception:  # a flip that breaks the file's structure: not the damage meant here
            continue
    raise AssertionError("no single-byte flip changes the shard's token data")


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_token_shard_fails_verify_but_not_classification(tmp_path: Path, damage: str) -> None:
    root, store = _demo(tmp_path)
    shard = _token_shards(root)[0]
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[:100])
    elif damage == "flip":
        shard.write_bytes(_flip_token_data(data))
    else:
        shard.unlink()
    # classification reads the snapshot manifest only, which is intact
    assert load_checkpoint(store, verify=False).counts()["continue"] > 0
    plan = load_checkpoint(store, verify=False)
    receipt = TokenSnapshotReceipt.model_validate(plan.record.token_snapshot)
    with pytest.raises(IntegrityError):
        verify_snapshot_data(store, receipt)
    with pytest.raises(CheckpointRejectedError) as info:
        verify_checkpoint(store)
    assert "token" in info.value.message
    with pytest.raises(CheckpointRejectedError):  # the default load verifies: fail closed
        load_checkpoint(store)
    result = CliRunner().invoke(app, ["verify", str(root)])
    assert result.exit_code == 1
    assert "token" in result.output


def _rewrite_row0(shard: Path, column: str, value: object) -> None:
    table = pq.read_table(shard)
    values = table[column].to_pylist()
    values[0] = value
    table = table.set_column(
        table.schema.get_field_index(column), column, pa.array(values, table.schema.field(column).type)
    )
    pq.write_table(table, shard, compression="zstd")


@pytest.mark.parametrize(
    ("column", "value"),
    [("digest", "0" * 64), ("length", 1), ("mask", None)],
    ids=["listed-digest", "listed-length", "invalid-entry"],
)
def test_a_row_that_disagrees_with_its_listing_or_decodes_to_no_entry_is_an_integrity_error(
    tmp_path: Path, column: str, value: object
) -> None:
    """Damage a reader could mistake for a record error or for metadata: the shard's own digest and
    length columns must agree with the snapshot, and bytes that decode to an invalid entry (a mask
    of -2s) are damage, not a caller's bad input."""
    root, store = _demo(tmp_path)
    shard = _token_shards(root)[0]
    if column == "mask":
        value = [-2] * len(pq.read_table(shard)["mask"][0].as_py())
    _rewrite_row0(shard, column, value)
    plan = load_checkpoint(store, verify=False)
    receipt = TokenSnapshotReceipt.model_validate(plan.record.token_snapshot)
    with pytest.raises(IntegrityError) as info:
        verify_snapshot_data(store, receipt)
    assert info.value.code == "integrity_error" and "altered" in info.value.message
    with pytest.raises(CheckpointRejectedError):
        verify_checkpoint(store)
