"""A custom data-source kind for tests: yields the rows written in its config.

It is registered through ``settings.KB_CUSTOM_CONNECTORS`` like any custom source, so the
tests exercise the real registry, the ingestion service and the embedder.
"""

from collections.abc import Iterator
from typing import Any

from sources.connectors.base import Connector, ConnectorConfig, DocumentRow, IngestReport


class RowsConfig(ConnectorConfig):
    rows: list[dict[str, Any]]
    count_units: bool = False  # report each row as a unit of progress, with the total known
    reported_total: int | None = None  # with count_units: the total to report instead (as a remote API might)


class RowsConnector(Connector):
    kind = "test_rows"
    config_model = RowsConfig

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        if self.config.count_units:
            report.total = len(self.config.rows) if self.config.reported_total is None else self.config.reported_total
            report.unit = "records"
        for raw in self.config.rows:
            yield DocumentRow(**raw)
            if self.config.count_units:
                report.advance()
