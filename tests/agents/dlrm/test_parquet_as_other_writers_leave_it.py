"""Parquet as writers other than pyarrow's defaults leave it (Hive and Impala's binary
strings, pandas' columns of nulls only) reads as the same rows (``agents.dlrm.formats``)."""

from __future__ import annotations

import numpy as np
import pytest

from agents.dlrm import formats, raw
from benchmarks.data_layouts import criteo_rows, parquet_table

pa = pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra)")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow (the parquet extra)")


def _rows(folder, batch_size: int) -> dict[str, np.ndarray]:
    """Every row of the Parquet files of ``folder``, read and parsed in this process."""
    chunks = formats.plan_chunks(folder, "parquet", batch_size)
    reader, parser = formats.TableReader(), formats.TableParse(raw.BadLines())
    parsed = [parser(reader(chunk)) for chunk in chunks]
    return {k: np.concatenate([p[k] for p in parsed]) for k in parsed[0]}


def _write(folder, table, row_group: int) -> None:
    folder.mkdir()
    pq.write_table(table, folder / "part-00000.parquet", row_group_size=row_group)


@pytest.mark.parametrize("dictionary", [False, True], ids=["plain", "dictionary-encoded"])
def test_binary_categoricals_decimals_and_columns_of_nulls_read_as_strings_ints_and_nulls(
    tmp_path, dictionary
):
    # Before, a binary column was refused ("column C1 is binary; a categorical feature is
    # hex strings"), and so were a column of type null ("column C22 is null") and a decimal
    # one ("column label is decimal128(20, 0), not a number").
    rows = criteo_rows(45, 11)
    rows.dense_missing[:, 11] = True  # I12
    rows.sparse_missing[:, 21] = True  # C22: all missing, as in small files of Criteo's
    strings = parquet_table(rows)
    theirs = strings
    for i in range(1, 27):
        at = theirs.schema.get_field_index(f"C{i}")
        theirs = theirs.set_column(at, f"C{i}", theirs.column(at).cast(pa.binary()))
    for name in ("I12", "C22"):
        at = theirs.schema.get_field_index(name)
        theirs = theirs.set_column(at, name, pa.nulls(len(rows)))
    for name in ("label", "I1", "I2"):  # a SQL engine's DECIMAL
        at = theirs.schema.get_field_index(name)
        theirs = theirs.set_column(at, name, theirs.column(at).cast(pa.decimal128(20, 0)))
    _write(tmp_path / "strings", strings, row_group=45)
    folder = tmp_path / "binary"
    folder.mkdir()
    pq.write_table(
        theirs, folder / "part-00000.parquet", row_group_size=7, use_dictionary=dictionary
    )
    mine = _rows(folder, batch_size=10)
    expected = _rows(tmp_path / "strings", batch_size=10)
    assert not mine["sparse_present"][:, 21].any() and np.isnan(mine["dense"][:, 11]).all()
    for key in expected:
        np.testing.assert_array_equal(mine[key], expected[key])


def test_numbers_stored_as_text_are_refused_saying_to_write_them_as_integers(tmp_path):
    # Before: "column label is string, not a number", without what to do.
    table = parquet_table(criteo_rows(5, 1))
    table = table.set_column(0, "label", table.column(0).cast(pa.string()))
    _write(tmp_path / "text", table, row_group=5)
    with pytest.raises(ValueError, match=r"column label is string, not a number \(numbers stored"):
        formats.plan_chunks(tmp_path / "text", "parquet", 4)


def test_a_file_written_again_while_it_is_read_is_named_and_said_to_have_changed(tmp_path):
    # Before: pyarrow's "OSError: Couldn't deserialize thrift: TProtocolException: Invalid
    # data" or "ArrowInvalid: Some index in row_group_indices is 2", naming no file.
    folder = tmp_path / "spark"
    _write(folder, parquet_table(criteo_rows(40, 2)), row_group=10)
    chunks = formats.plan_chunks(folder, "parquet", 8)
    reader, parser = formats.TableReader(), formats.TableParse(raw.BadLines())
    parser(reader(chunks[0]))  # the worker holds the file open, its footer read
    pq.write_table(
        parquet_table(criteo_rows(12, 3)), folder / "part-00000.parquet", row_group_size=6
    )
    for reading in (reader, formats.TableReader()):  # with the old footer, and a new one's
        with pytest.raises(ValueError, match=r"part-00000.parquet: .*the file changed after"):
            parser(reading(chunks[3]))
