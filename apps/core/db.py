"""The database's two dialects in one place: the vendor test, the locks, and pool threads'
connections.

Graphene runs on PostgreSQL (production) and on SQLite (embedded mode: one process, one
file). Code whose SQL differs between them asks ``is_postgresql()``. The locks PostgreSQL
gives as advisory locks are taken here, each with what stands in for it on SQLite:

* ``advisory_lock(key)``: held by this thread across transactions until the block ends. A
  PostgreSQL session lock (the server releases it if the process dies, as its connection
  closes); on SQLite a process-local lock, enough because embedded mode is one process.
* ``advisory_xact_lock(key)``: held to the end of the current transaction. Nothing on SQLite:
  every write transaction there takes the database's write lock as it begins
  (``transaction_mode: IMMEDIATE``, settings/base.py), which serializes such blocks already.

Numbers that concurrent transactions take without waiting for each other (a run's number, a
new record tree's id) come from PostgreSQL sequences, ``sequence_next(name, taken=...)``; on
SQLite the caller counts on from the highest taken, its write lock serializing the writers.

Keys are 64-bit integers; ``lock_key(name)`` makes one from a name.

The web process's asynchronous code (websocket consumers, ASGI middleware, live follows)
reaches the database through ``on_db_thread(fn)``: a pool of threads of its own, not the one
thread that Channels' ``database_sync_to_async`` runs every call of the process on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Model
from django.db.models.fields import AutoFieldMixin, Field

P = ParamSpec("P")
T = TypeVar("T")


def is_postgresql(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether the database behind ``using`` is PostgreSQL (else SQLite, embedded mode)."""
    return connections[using].vendor == "postgresql"


def lock_key(name: str) -> int:
    """The advisory lock key of ``name``: 64 bits of its hash, signed as PostgreSQL's bigint."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        # Re-entrant, as PostgreSQL's session locks are within their session (a thread's connection).
        self.lock = threading.RLock()
        self.users = 0  # threads holding the lock or waiting for it


class LocalLocks:
    """Process-local locks by key (SQLite's stand-in for session advisory locks).

    An entry lives only while a thread holds or waits for its lock: the count of those is
    kept under one guard, and the last to leave removes the entry. So the table holds at most
    one entry per thread inside ``hold``, however many keys pass through it (a table with an
    entry for every key ever locked, one per record id, grew for the life of the process).
    Two threads on one key always share one entry: an entry is removed only when no thread
    holds or waits for it, so a thread that finds none creates a lock no one else is in.

    Not a fixed stripe of locks: unrelated keys on one stripe would wait for each other, and
    a thread holding one key while taking another on the same stripe could deadlock with a
    thread doing the same the other way round.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @contextmanager
    def hold(self, key: int) -> Iterator[None]:
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._guard:
                entry.users -= 1
                if not entry.users:
                    del self._entries[key]


local_locks = LocalLocks()


@contextmanager
def advisory_lock(key: int) -> Iterator[None]:
    """Hold the lock ``key`` for the block, across transactions (see the module's docstring)."""
    if not is_postgresql():
        with local_locks.hold(key):
            yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [key])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def advisory_xact_lock(key: int) -> None:
    """Take the lock ``key`` until the end of the open transaction (see the module's docstring)."""
    if not connection.in_atomic_block:
        # Outside a transaction PostgreSQL would release it at once, and nothing would be serialized.
        raise RuntimeError("an advisory transaction lock needs an open transaction")
    if is_postgresql():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def sequence_next(name: str, *, taken: str, params: Sequence[Any] = ()) -> int:
    """The next value of the PostgreSQL sequence ``name`` (one round trip, no lock: a sequence
    hands out each value once, whatever the transactions around it do; a value taken by a
    transaction that rolls back is skipped). ``taken``: a query answering the highest value
    already in use (or NULL), with its ``params``, where a sequence made on first use starts
    after it.

    Made on first use rather than by a migration, so that anything (a pipeline, the record
    tree) gets one whenever it first needs numbers. Only one transaction makes it: the maker
    holds an advisory lock until its transaction commits, and whoever waited for it finds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(to_regclass(%s))", [name])  # NULL while there is no such sequence
        value = cursor.fetchone()[0]
        if value is not None:
            return int(value)
        with transaction.atomic():  # the lock must outlive the statements that make the sequence
            advisory_xact_lock(lock_key(f"sequence:{name}"))
            # Looked up in pg_class itself: this statement's snapshot sees a sequence committed
            # while we waited for the lock; the name lookup of to_regclass/regclass may not (this
            # backend's catalog cache can still say "no such relation" until it next takes a
            # relation lock), so the value is then taken by its oid.
            cursor.execute(
                "SELECT oid FROM pg_class WHERE relname = %s AND relnamespace = current_schema()::regnamespace",
                [name],
            )
            found = cursor.fetchone()
            if found is None:
                cursor.execute(f'CREATE SEQUENCE "{name}"')
                cursor.execute(f"SELECT setval(%s, COALESCE(({taken}), 0) + 1, false)", [name, *params])
                cursor.execute("SELECT nextval(%s)", [name])
            else:
                cursor.execute("SELECT nextval(%s::oid)", [found[0]])
            return int(cursor.fetchone()[0])


def sequences_next(wanted: Sequence[tuple[str, str, Sequence[Any]]], *, lock: int | None = None) -> list[int]:
    """``sequence_next`` of several sequences, each ``(name, taken, params)``, in one round trip
    when they all exist (any made on first use is made as ``sequence_next`` makes it). ``lock``:
    the advisory lock taken in the same statement, held to the end of the transaction."""
    with connection.cursor() as cursor:
        calls = ", ".join(["nextval(to_regclass(%s))"] * len(wanted))
        params: list[Any] = [name for name, _taken, _params in wanted]
        if lock is not None:
            calls, params = f"{calls}, pg_advisory_xact_lock(%s)", [*params, lock]
        cursor.execute(f"SELECT {calls}", params)
        values = cursor.fetchone()[: len(wanted)]
    return [
        int(value) if value is not None else sequence_next(name, taken=taken, params=params)
        for value, (name, taken, params) in zip(values, wanted, strict=True)
    ]


def insert_json_groups(groups: Sequence[tuple[type[Model], JsonRows]]) -> None:
    """INSERT rows of several models (each model's rows as ``json_rows`` made them), auto ids
    not set, in one prepared PostgreSQL statement: a data-modifying CTE per model (foreign
    keys are checked at commit). For a path every run start takes, where a round trip and an
    ORM insert per row cost more than the rows."""
    if not is_postgresql():
        raise RuntimeError("insert_json_groups writes through PostgreSQL's jsonb_to_recordset")
    parts = [f"i{i} AS ({insert_select(model, found)})" for i, (model, found) in enumerate(groups)]
    params: list[Any] = [found.param for _model, found in groups]
    with prepared_cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT 1", params)


def closes_connections(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` for a thread of one of our own pools: the database connections it opened on its
    thread are closed when it returns. Django's connections are per thread; a request's are
    closed by Django and a task's by graphene_project/celery.py, but a pool thread has neither,
    so each kept one open for the life of the process. Never for the calling thread's work: it
    would close that thread's connection, in the middle of whatever it is doing."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return run


def is_pooled(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether this process borrows its connections from a pool (the web process, settings/base.py)."""
    return bool(connections[using].settings_dict.get("OPTIONS", {}).get("pool"))


def release_pooled_connection(using: str = DEFAULT_DB_ALIAS) -> None:
    """Give this thread's connection back to the pool, for code that waits between queries (a
    poll loop, a live follow): the pool is bounded, and a waiting request that kept its
    connection would keep it from the others for the whole wait. The next query borrows one
    again. Nothing in a process that is not pooled (a new connection per poll would cost more
    than the one kept), nor inside a transaction."""
    conn = connections[using]
    if is_pooled(using) and not conn.in_atomic_block:
        conn.close()


_db_threads: ThreadPoolExecutor | None = None
_db_threads_guard = threading.Lock()


def _db_executor() -> ThreadPoolExecutor:
    global _db_threads
    with _db_threads_guard:
        if _db_threads is None:
            # As many threads as the web's pool has connections: more would only wait for one.
            size = max(1, int(getattr(settings, "GRAPHENE_WEB_DB_POOL_MAX", 20)))
            _db_threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="graphene-db")
        return _db_threads


def on_db_thread(fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """``fn`` as an awaitable for asynchronous code (websocket consumers, ASGI middleware, live
    follows), run on a thread of a bounded pool of our own, its connections closed after it
    (given back to the web's pool).

    Not Channels' ``database_sync_to_async`` as it comes: "thread sensitive", it runs every call
    of the process, of every socket, on one shared thread, so one call that waits (on a row
    lock, on a full connection pool) held up every other socket's handshake and messages with
    it. Calls of one consumer still run one after the other, as it awaits each in turn."""
    return database_sync_to_async(fn, thread_sensitive=False, executor=_db_executor())


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


@dataclass(frozen=True)
class JsonRows:
    """Rows of a model as one JSON parameter for PostgreSQL's ``jsonb_to_recordset``:
    ``FROM jsonb_to_recordset(%s::jsonb) AS x(<recordset>)`` yields ``columns``."""

    columns: list[str]  # quoted column names
    recordset: str  # the column definition list
    param: str


def json_rows(model: type[Model], rows: Sequence[Model], *, exclude: Sequence[str] = ()) -> JsonRows:
    """``rows`` (unsaved) as a ``JsonRows``: every concrete column but an auto id and those named
    in ``exclude``, each value as ``bulk_create`` takes it (``pre_save``: ``auto_now`` columns
    are set) and prepared by its field (JSON columns stay JSON).

    One parameter instead of ``bulk_create``'s one per column per row, each quoted in Python by
    the client cursor and prepared through its field: for a deletion batch's hundred spans that
    cost more of a worker's CPU than the statement (bench/cascade_delete.py)."""
    fields, columns, recordset = _recordset(model, tuple(exclude))
    payload = [{f.column: _json_value(f.get_prep_value(f.pre_save(row, True))) for f in fields} for row in rows]
    return JsonRows(columns=columns, recordset=recordset, param=json.dumps(payload, cls=DjangoJSONEncoder))


@functools.cache
def _recordset(model: type[Model], exclude: tuple[str, ...]) -> tuple[list[Field[Any, Any]], list[str], str]:
    """A model's inserted fields, their quoted columns and the column definition list (the same
    for every statement: computed once per process)."""
    fields = [
        f
        for f in model._meta.concrete_fields
        if not (f.primary_key and isinstance(f, AutoFieldMixin)) and f.column not in exclude
    ]
    quote = connection.ops.quote_name
    columns = [quote(f.column) for f in fields]
    # The short name of a type the list repeats: statements stay short (psycopg keeps its parse
    # of a statement of up to 4 KiB, and parses a longer one again at each execution).
    types = [str(f.db_type(connection)).replace("timestamp with time zone", "timestamptz") for f in fields]
    return fields, columns, ", ".join(f"{column} {type_}" for column, type_ in zip(columns, types, strict=True))


def insert_rows(model: type[Model], rows: Sequence[Model]) -> None:
    """INSERT unsaved ``rows`` of ``model`` in one statement, without setting their ids.

    PostgreSQL: one JSON parameter (``json_rows``). Elsewhere (SQLite) ``bulk_create``."""
    if not rows:
        return
    if not is_postgresql():
        model._default_manager.bulk_create(rows)
        return
    found = json_rows(model, rows)
    with connection.cursor() as cursor:
        cursor.execute(insert_select(model, found), [found.param])


def insert_select(model: type[Model], found: JsonRows) -> str:
    """The PostgreSQL statement inserting ``found`` (``json_rows`` of ``model``) from its one
    JSON parameter (``%s``)."""
    columns = ", ".join(found.columns)
    return (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({columns}) "  # noqa: S608 - names from the model
        f"SELECT {columns} FROM jsonb_to_recordset(%s::jsonb) AS x({found.recordset})"
    )


def uuid_array(ids: Iterable[Any]) -> list[uuid.UUID]:
    """Ids (UUIDs or their text) as one ``uuid[]`` parameter (``= ANY(%s)``): one value for the
    whole list, where ``IN`` took a parameter per id, each quoted in Python."""
    return [pk if isinstance(pk, uuid.UUID) else uuid.UUID(str(pk)) for pk in ids]


def select_columns(model: type[Model], alias: str, *, prefix: str = "") -> str:
    """``model``'s concrete columns from the table aliased ``alias``, in ``model_from_row``'s
    order; each renamed ``prefix`` + its name when given (two models' columns in one row)."""
    quote = connection.ops.quote_name
    return ", ".join(
        f"{alias}.{quote(f.column)}" + (f" AS {quote(prefix + f.column)}" if prefix else "")
        for f in model._meta.concrete_fields
    )


def models_from_row(models: Sequence[type[Model]], row: Sequence[Any]) -> list[Any]:
    """Instances of ``models`` (as if the ORM had read them) from one row of a raw cursor
    holding each one's concrete columns in turn, in ``select_columns`` order: each value
    converted by its field as a queryset would (a JSON column arrives as text). A model whose
    primary key is NULL (an outer join found none) is None."""
    found: list[Any] = []
    at = 0
    for model in models:
        fields, converters, pk_at = _row_converters(model)
        values = row[at : at + len(fields)]
        at += len(fields)
        if values[pk_at] is None:
            found.append(None)
            continue
        converted = []
        for value, field_converters in zip(values, converters, strict=True):
            for convert, expression in field_converters:
                value = convert(value, expression, connection)
            converted.append(value)
        found.append(model.from_db(connection.alias, [f.attname for f in fields], converted))
    if at != len(row):
        raise ValueError(f"a row of {len(row)} columns is not one of {', '.join(m.__name__ for m in models)}")
    return found


@functools.cache
def _row_converters(model: type[Model]) -> tuple[list[Field[Any, Any]], list[list[tuple[Any, Any]]], int]:
    """A model's concrete fields, each one's converters (as a queryset applies them) and where
    its primary key is among them: the same for every row, computed once per process."""
    fields = list(model._meta.concrete_fields)
    converters = []
    for field in fields:
        col = field.get_col(model._meta.db_table)
        converters.append([(c, col) for c in connection.ops.get_db_converters(col) + col.get_db_converters(connection)])
    return fields, converters, fields.index(model._meta.pk)


_PREPARE_ONLY_WHEN_ASKED = 2**62


@contextmanager
def prepared_cursor() -> Iterator[Any]:
    """A cursor whose statements the server plans once per connection (PostgreSQL), for the
    few big statements run on every declaration or deletion batch: planning one of them took
    longer than running it (``EXPLAIN ANALYZE``: ~0.45 ms planning, ~0.35 ms execution for a
    declaration). Django turns psycopg's automatic preparation off (for connection poolers
    between it and the server, which Graphene does not use); this cursor binds parameters on
    the server and prepares what it executes. It goes through Django's cursor wrapper, so
    execute wrappers and query logging see its statements. Elsewhere: an ordinary cursor."""
    if not is_postgresql():
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    if connection.connection.prepare_threshold is None:
        # Django opens connections with psycopg's preparation off (``prepare_threshold=None``),
        # and then psycopg ignores ``prepare=True`` too. A threshold no statement reaches by
        # repetition turns it back on: only what this cursor asks for is prepared.
        connection.connection.prepare_threshold = _PREPARE_ONLY_WHEN_ASKED
    raw = _prepared_cursor_class()(connection.connection)
    wrapped = _PreparedDebugCursor(raw, connection) if connection.queries_logged else connection.make_cursor(raw)
    with wrapped:
        yield wrapped


class _PreparedDebugCursor(CursorDebugWrapper):
    """Django's query log for a prepared cursor: psycopg keeps no composed text of a prepared
    statement (Django's ``last_executed_query`` finds none), so the log holds the statement as
    written, placeholders and all."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(sql, params):
            return CursorWrapper.execute(self, sql, params)


@functools.cache
def _prepared_cursor_class() -> type[Any]:
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]  # made at import for psycopg 3

    class Prepared(ServerBindingCursor):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            return super().execute(query, params, prepare=True)

    return Prepared
