"""The warehouse: where the application's Delta tables live, and how delta-rs reaches them.

A `Warehouse` is a location (a local path or an object-store URI, dispatch/storage.py) with the
delta-rs storage options for it, so every reader and writer of a table (the fold, the leader's
rebuild, the views, the demo) opens it the same way: `warehouse.open("jobs")`. Spark reaches
the same URIs through its own Hadoop configuration (streaming/session.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dispatch import storage
from dispatch.settings import Settings, StorageSettings

if TYPE_CHECKING:
    from deltalake import DeltaTable

_LOG_FILE = re.compile(r"^\d{20}\.|^_last_checkpoint$")
"""A commit, checkpoint or checksum of a Delta log (`00000000000000000000.json`, ...): what
makes a log a table's rather than the leftovers of a creation that never committed."""

_NOT_WHOLE_YET = ("No protocol found", "No table metadata or protocol found", "No metadata found")
"""delta-kernel's words for a log whose first commit lacks its protocol or its metadata."""


@dataclass(frozen=True)
class Warehouse:
    location: str
    """Normalized: an absolute path or a URI without a trailing slash."""
    storage_options: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    """delta-rs' options for the location (credentials: kept out of repr())."""

    @classmethod
    def of(cls, settings: Settings) -> Warehouse:
        """The warehouse the settings name (`paths.warehouse`, `[storage]`)."""
        return cls.at(settings.paths.warehouse, settings.storage)

    @classmethod
    def at(cls, location: str | Path, storage_settings: StorageSettings | None = None) -> Warehouse:
        """The warehouse at `location`; `storage_settings` for an object store (else the AWS
        environment variables alone)."""
        found = storage.Location.at(location, storage_settings)
        return cls(found.uri, found.options)

    @property
    def is_local(self) -> bool:
        return not storage.is_object_store(self.location)

    def table(self, name: str) -> str:
        """The location of table `name` (what Spark's `load`/`save` and delta-rs take)."""
        return storage.join(self.location, name)

    def open(self, name: str, version: int | None = None) -> DeltaTable:
        """Table `name` through delta-rs (its latest version, or `version`); raises
        deltalake's TableNotFoundError when it does not exist."""
        from deltalake import DeltaTable

        return DeltaTable(self.table(name), version=version, storage_options=self.storage_options)

    def open_if_exists(self, name: str) -> DeltaTable | None:
        """Table `name` at its latest version, or None when it has not been created yet,
        or is being created: its first commit is not whole yet."""
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            return self.open(name)
        except TableNotFoundError:
            return None
        except DeltaError as error:
            # A reader polling while Spark creates the table can see its first commit before
            # it is whole: a chaos run on S3Proxy read `jobs` as "No protocol found in delta
            # log" (commitInfo and metaData, not yet the protocol), and failed. Not created
            # yet, as far as a reader can tell; any other error is a real one.
            if any(sign in str(error) for sign in _NOT_WHOLE_YET):
                return None
            raise

    def abandoned_log(self, name: str) -> str | None:
        """The log folder of table `name` when it exists but holds no commit: what a creator
        killed before its first commit leaves behind (Spark's Delta makes `_delta_log/` and
        `_delta_log/_staged_commits/` first; the first alone, empty, is enough). Spark's
        Delta takes such a folder for a table and fails to create it (DELTA_TABLE_NOT_FOUND).
        None for a table, or for nothing there."""
        log = storage.join(self.table(name), "_delta_log")
        if not storage.exists(log, self.storage_options):
            return None
        files = storage.file_names(log, self.storage_options)
        if any(_LOG_FILE.match(Path(file).name) for file in files):
            return None
        return log
