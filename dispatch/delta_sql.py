"""Filtered reads of Delta tables through delta-rs' own engine (DataFusion), not pyarrow.

Why not `to_pyarrow_dataset(...).to_table(filter=...)`: files rewritten by delta-rs' MERGE,
UPDATE or DELETE (deltalake 1.4+) store their string columns as Arrow `string_view`, and
pyarrow (26) has no comparison kernels for `string_view`: a filter pushed down to such a file
fails with "Function 'equal' has no kernel matching input types (string, string_view)" (the
`jobs` table is MERGEd by delta-rs every batch; delta-io/delta-rs#4579). DataFusion reads both
layouts. Results come back with plain `string` / `binary` columns, which every pyarrow kernel
and `to_pylist` handle.

A read without a filter (`to_pyarrow_table()`, `to_pyarrow_dataset().to_table(columns=...)`)
is safe: pyarrow casts each file to the table's schema. Keep the SQL small: DataFusion
overflows its stack (a segfault) on an IN list of ~50k literals (deltalake 1.6.6); match large
sets of keys after an unfiltered read instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from deltalake import DeltaTable


def sql_text(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def plain_types(table: pa.Table) -> pa.Table:
    """`table` with view-typed string/binary columns cast to plain `string` / `binary`."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    fields = [field.with_type(plain.get(field.type, field.type)) for field in table.schema]
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)


def query(table: DeltaTable, name: str, sql: str) -> pa.Table:
    """Run `sql` over `table` registered as `name`; plain Arrow types in the result."""
    from deltalake import QueryBuilder

    reader = QueryBuilder().register(name, table).execute(sql)
    return plain_types(pa.table(reader.read_all()))
