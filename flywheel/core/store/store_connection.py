"""The store's connections: short-lived, retried while another process holds DuckDB's single-writer file lock
(so several processes share one file), read-only for readers; `check_store`, which refuses a file flywheel
cannot use as it is; and the helpers every table module writes rows with.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import duckdb
import polars as pl

from flywheel.core.store.store_schema import (
    SCHEMA,
    STORE_FIX,
    DamagedStoreError,
    ForeignStoreError,
    check_schema,
    create_views,
    migrate,
)


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


log = logging.getLogger("flywheel.core.store")  # the store's one logger, whichever module says it
SAY_WAIT_AFTER_S = 1.0  # a wait on another process's lock longer than this is said, once


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()  # not "lock" alone: a corrupt block's error says "block"
    return "set lock" in text or "conflict" in text


class StoreBusyError(RuntimeError):
    """Another process held the store's file lock for longer than the store waits."""


def _lock_holder(message: str) -> str:
    """The process DuckDB names in its lock error ("... (PID 123) ..."), described with psutil."""
    match = re.search(r"PID (\d+)", message)
    if not match:
        return "another process"
    pid = int(match.group(1))
    try:
        import psutil

        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline()) or proc.name()
        return f"process {pid} ({cmd[:160]}, user {proc.username()})"
    except Exception:  # noqa: BLE001 - gone, or not ours to inspect: the PID alone still names it
        return f"process {pid}"


_SURROGATES = re.compile("[\ud800-\udfff]")


def encodable(value: Any) -> Any:
    """A string DuckDB and Arrow can encode: lone surrogates (from a model's bytes) become U+FFFD."""
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATES.sub("\ufffd", value)
    return value


def where_sql(scope: dict[str, Any]) -> str:
    """`col = ? AND ...` for a column scope (TRUE when empty); values go as parameters."""
    return " AND ".join(f"{k} = ?" for k in scope) or "TRUE"


# A DuckDB file: 3 headers of 4 KiB, then blocks of `block_size` bytes (at least its `used_blocks`).
_HEADERS_BYTES = 3 * 4096


def check_store(path: str | Path, *, whole: bool = True, lock_timeout_s: float = 120.0) -> None:
    """Refuse a store file flywheel cannot use as it is, opening it read-only (nothing is written to it):
    one that cannot be read whole (zero bytes, truncated; with `whole`, every table is read, so a corrupt
    block fails here too) or that holds another schema or a newer version of flywheel's (a table or a
    column this flywheel does not know). A missing file is fine (a new store)."""
    path = Path(path)
    if not path.exists():
        return
    if path.is_dir():
        raise ForeignStoreError(f"the store {path} is a folder, not a DuckDB file: {STORE_FIX}.")
    size = path.stat().st_size
    damaged = f"nothing was written to it: restore it from a backup, or {STORE_FIX}"
    try:
        with open_connection(path, read_only=True, lock_timeout_s=lock_timeout_s) as con:
            _, _, block_size, _, used_blocks, *_ = con.execute("PRAGMA database_size").fetchone()
            size = path.stat().st_size  # now: no writer can grow it while this connection is open
            if size < (need := _HEADERS_BYTES + int(used_blocks) * int(block_size)):
                raise DamagedStoreError(f"{path} is truncated ({size:,} bytes, its used blocks need at least "
                                        f"{need:,}); {damaged}.")
            check_schema(con, path)
            if whole:
                for (table,) in con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                            "table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall():
                    con.execute(f'SELECT bit_xor(hash(COLUMNS(*))) FROM "{table}"').fetchall()
    except duckdb.Error as exc:
        raise DamagedStoreError(f"{path} ({size:,} bytes) cannot be read whole as a DuckDB store "
                                f"({' '.join(str(exc).split())[:200]}); {damaged}.") from None


# How long a reader (`Store.reader`: report, export, paper) waits for a writer: a run's connections are short-lived
# (one write each), so a few seconds see them through; a writer that holds the file longer is named at once.
READER_WAIT_S = 3.0


def _busy_message(path: Path, error: str, *, read_only: bool, lock_timeout_s: float) -> str:
    holder = _lock_holder(error)
    if read_only and lock_timeout_s <= READER_WAIT_S:
        return (f"The store {path} is open for writing by {holder} (DuckDB lets readers in only when no writer "
                "holds the file): wait for that run to finish, or close that connection (a notebook or `duckdb` shell "
                "left open read-write? open it with read_only=True), then re-run.")
    return (f"The store {path} stayed locked for {lock_timeout_s:.0f} s by {holder}. Close that connection (a "
            "notebook or `duckdb` shell left open?) or stop that process, then re-run.")


@contextmanager
def open_connection(path: Path, *, read_only: bool, lock_timeout_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to `path`, retried while another process holds DuckDB's file lock."""
    started = time.monotonic()
    deadline = started + lock_timeout_s
    delay, said = 0.05, False
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as exc:  # another process holds the write lock
            if not _is_lock_error(exc):
                raise
            now = time.monotonic()
            if not said and now - started >= SAY_WAIT_AFTER_S and now < deadline:  # once, not for a brief wait
                said = True
                log.warning("store %s is locked by %s; waiting up to %.0f s more, then this %s fails with "
                            "StoreBusyError naming it (a retried step waits again). Close that connection or "
                            "stop that process to go on now", path, _lock_holder(str(exc)), deadline - now,
                            "read" if read_only else "write")
            if now > deadline:
                raise StoreBusyError(_busy_message(path, str(exc), read_only=read_only,
                                                   lock_timeout_s=lock_timeout_s)) from None
            time.sleep(delay + random.random() * delay)
            delay = min(delay * 2, 2.0)
    try:
        yield con
    finally:
        con.close()


class StoreConnection:
    """A store file's connections, its writer's method and whether it only reads: what every table group
    (`Store`'s bases) uses."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 120.0, method: str = "bpo",
                 read_only: bool = False) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        # The training method (experiment arm) this store's writer belongs to: every trajectory and
        # checkpoint it writes carries it in the `method` column (flywheel.orchestration.methods names them).
        self.method = method
        # A reader (reports) opens DuckDB read-only and never creates, migrates or touches the file.
        self.read_only = read_only
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"no store at {self.path}: nothing to read")
            check_store(self.path, whole=False, lock_timeout_s=lock_timeout_s)
            return
        check_store(self.path, whole=False, lock_timeout_s=lock_timeout_s)  # read-only: refused before any write
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as con:
            migrate(con)
            con.execute(SCHEMA)
            create_views(con)

    @classmethod
    def reader(cls, path: str | Path, *, lock_timeout_s: float = READER_WAIT_S) -> Self:
        """The store opened read-only, as every report reads it (report, export, paper, the dashboard): nothing is
        created, migrated or written, so the file's bytes never change; any number of readers share it, and a
        writer that holds it is named at once (StoreBusyError) instead of waited for. A missing file is a
        FileNotFoundError naming it."""
        return cls(path, read_only=True, lock_timeout_s=lock_timeout_s)

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with open_connection(self.path, read_only=self.read_only, lock_timeout_s=self.lock_timeout_s) as con:
            yield con

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pl.DataFrame:
        with self.connect() as con:
            return pl.from_arrow(con.sql(sql, params=params or None).to_arrow_table())  # type: ignore[return-value]
