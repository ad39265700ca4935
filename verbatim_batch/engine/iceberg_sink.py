"""Ray's Iceberg datasink writing data files only (``DataFilesSink``, used by ``publish.write_data_files``).

Apart from ``publish`` because it subclasses a Ray Data class, which the CLI does not import to parse options.
"""

from __future__ import annotations

from typing import Any

from ray.data._internal.datasource.iceberg_datasink import IcebergDatasink

from verbatim_batch.core.faults import fault_point


class DataFilesSink(IcebergDatasink):
    """Ray's Iceberg datasink (what ``Dataset.write_iceberg`` runs) writing data files only: no schema change, no
    commit (``publish.commit_night`` does). Its ``data_files`` are set once the write completes."""

    def __init__(self, table: Any) -> None:
        super().__init__(table_identifier=".".join(table.name()), catalog_kwargs={})
        self._io, self._table_metadata = table.io, table.metadata
        self.data_files: list[Any] = []

    def on_write_start(self, schema: Any = None) -> None:  # the table is ours: its schema is the declared one
        pass

    def write(self, blocks: Any, ctx: Any) -> Any:
        fault_point("publish.write")
        return super().write(blocks, ctx)

    def on_write_complete(self, write_result: Any) -> None:
        self.data_files = [f for r in write_result.write_returns if r for f in r.data_files]
