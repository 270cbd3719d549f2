"""A fast path for the SQLite ledger's hot statements: compiled once, then run straight on the
stdlib sqlite3 cursor.

Why: the ledger's hot statements are module-level constants (payments/ledger.py's
_INSERT_PAYMENT, payments/channels/store.py's reserve and commit guards), already compiled and
cached by SQLAlchemy, yet each execution costs ~40 µs of CPU in SQLAlchemy's execution layer
(the compiled-cache lookup, a new execution context, construct_params, the result's setup,
events) against ~4 µs for SQLite to run it; a voucher call sends five of them. Run here, one
costs ~13 µs, and a voucher call's two ledger writes ~30% less CPU (bench/README.md, "Channels
and upto").

What: `HotStatements.execute` counts the uses of each statement object (a bounded LRU keyed by
id, holding the statement so its id cannot be reused while it is cached). A statement used more
than `FAST_AFTER_USES` times is compiled once for SQLite, per set of parameter names, and from
then on runs as its SQL string with positional parameters: each taken from the caller's
parameters under the name construct_params would take it from (resolved once), or the
statement's own value (processed once), through the compiled bind processors, as SQLAlchemy's
execution context builds them; sent through `Connection._cursor_execute` (cursor events, echo
and the wrapping of DBAPI errors into sqlalchemy.exc stay SQLAlchemy's). Rows come back as
SQLAlchemy's own Row objects, through the compiled result processors, in an `IteratorResult`:
the same values, types and API as a CursorResult's. Statements built per call never reach the
threshold and run through SQLAlchemy as before. Anything unusual sends its statement through
SQLAlchemy for good: parameters given as a list (executemany), an expanding (IN) or
literal-execute parameter given at execute time, text() and other non-Core statements,
execution options, Python-side column defaults, a compile that fails. Statement-level execute
events, or connection options other than the ledger's own, send the call through SQLAlchemy
too. An IN list of constants (`state.in_((...))` in a module-level statement) is expanded once,
at compile time: its values are part of the statement.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.engine.result import IteratorResult, SimpleResultMetaData
from sqlalchemy.exc import ResourceClosedError
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.sql.selectable import Select

FAST_AFTER_USES: int | None = 3  # uses through SQLAlchemy before a statement runs fast; None: off
CACHE_SIZE = 256  # statements tracked (hot ones are a few dozen; the rest are built per call)
_SAFE_OPTIONS = frozenset({"reading"})  # the ledger's own connection option (payments/ledger.py)


class _Unusual(Exception):
    """The statement is not one the fast path runs: SQLAlchemy runs it."""


class _Plan:
    """One statement compiled for one set of parameter names: the SQL, each positional
    parameter's source (a parameter given at execute time, or the statement's own value,
    processed once), and how its rows are read back."""

    __slots__ = ("sql", "template", "given", "metadata", "counts_first")

    def __init__(self, statement: Any, keys: Sequence[str], params: Mapping[str, Any] | None,
                 dialect: Dialect) -> None:
        compiled: Any = statement.compile(dialect=dialect, column_keys=sorted(keys),
                                          for_executemany=False)
        if (not compiled.positional or compiled._numeric_binds or compiled.escaped_bind_names
                or compiled.insert_prefetch or compiled.update_prefetch
                or compiled.implicit_returning or compiled._collected_params):
            raise _Unusual
        # Where construct_params takes each parameter's value from: the execute-time key, else
        # the statement's own value (a callable one would be evaluated per execution).
        source: dict[str, str | None] = {}
        for bind, name in compiled.bind_names.items():
            given = bind.key if bind.key in keys else name if name in keys else None
            if (given is None and bind.callable) or source.setdefault(name, given) != given:
                raise _Unusual
        values = compiled.construct_params(params, escape_names=False)  # (raises if one lacks)
        processors: dict[str, Any] = dict(compiled._bind_processors)
        self.sql: str = compiled.string
        positions: Sequence[str] = compiled.positiontup
        late = compiled.post_compile_params | compiled.literal_execute_params
        if late:
            if any(source[compiled.bind_names[b]] is not None for b in late):
                raise _Unusual  # an IN list given at execute time: SQLAlchemy expands it per call
            # the statement's own IN list: expanded once, as SQLAlchemy does on every execution
            expanded = compiled._process_parameters_for_postcompile(values)  # (updates values)
            self.sql, positions = expanded.statement, expanded.positiontup
            processors.update(expanded.processors)
        if any(not callable(p) for p in processors.values()):  # (tuple types' processors)
            raise _Unusual
        self.template: list[Any] = []
        self.given: list[tuple[int, str, Callable[[Any], Any] | None]] = []
        for index, name in enumerate(positions):
            process = processors.get(name)
            given = source.get(name)
            if given is not None:
                self.given.append((index, given, process))
                self.template.append(None)
            else:  # a constant: processed once
                value = values[name]
                self.template.append(process(value) if process is not None else value)
        self.metadata = _result_metadata(compiled, dialect)
        self.counts_first = bool(compiled.isupdate or compiled.isdelete)

    def parameters(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """The DBAPI parameters, as SQLAlchemy's execution context builds them."""
        args = self.template.copy()
        for index, key, process in self.given:
            value = params[key]
            args[index] = process(value) if process is not None else value
        return tuple(args)


def _result_metadata(compiled: Any, dialect: Dialect) -> SimpleResultMetaData | None:
    """The rows' keys (names, and the Column objects a row may be indexed by) and result
    processors, as CursorResultMetaData takes them from a compiled statement matched by
    position; None for a statement without rows."""
    columns = compiled._result_columns
    if not columns:
        return None
    if (not compiled._ordered_columns or compiled._textual_ordered_columns
            or compiled._ad_hoc_textual or compiled._loose_column_name_matching):
        raise _Unusual
    keys = [keyname for keyname, _, _, _ in columns]
    if len(set(keys)) != len(keys) or any(key != name for key, name, _, _ in columns):
        raise _Unusual  # (ambiguous or truncated names: SQLAlchemy's own bookkeeping)
    # (the stdlib sqlite3 driver's cursor.description carries no type: None, as for SQLAlchemy)
    processors = [type_._cached_result_processor(dialect, None) for _, _, _, type_ in columns]
    return SimpleResultMetaData(keys, extra=[objects for _, _, objects, _ in columns],
                                _processors=processors)


class _RowsResult(IteratorResult[Any]):
    """The rows of a statement that returns them, already fetched, with the rowcount a
    CursorResult would give."""

    def __init__(self, metadata: SimpleResultMetaData, rows: list[Any], rowcount: int) -> None:
        super().__init__(metadata, iter(rows))
        self.rowcount = rowcount

    @property
    def returns_rows(self) -> bool:
        return True


class _Written:
    """An INSERT, UPDATE or DELETE without RETURNING: how many rows it changed, no rows (any
    other use raises as a CursorResult without rows does)."""

    __slots__ = ("rowcount",)
    returns_rows = False

    def __init__(self, rowcount: int) -> None:
        self.rowcount = rowcount

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise _no_rows()

    def __iter__(self) -> Any:
        raise _no_rows()


def _no_rows() -> ResourceClosedError:
    return ResourceClosedError("This result object does not return rows. "
                               "It has been closed automatically.")


class _Entry:
    __slots__ = ("statement", "uses", "plans", "slow")

    def __init__(self, statement: Any, slow: bool) -> None:
        self.statement = statement  # held: its id cannot be reused while it is cached
        self.uses = 0
        self.plans: dict[tuple[str, ...], _Plan] = {}
        self.slow = slow


class HotStatements:
    """The fast path of one SQLite engine (module docstring). `threshold`: how many uses go
    through SQLAlchemy first (None: all of them, the fast path off)."""

    def __init__(self, engine: Engine, *, threshold: int | None = None,
                 size: int | None = None) -> None:
        self._dialect = engine.dialect
        self._events = engine.dispatch
        self._threshold = threshold if engine.dialect.name == "sqlite" else None
        self._size = CACHE_SIZE if size is None else size
        self._entries: OrderedDict[int, _Entry] = OrderedDict()

    @property
    def compiled_count(self) -> int:
        """How many statements (per set of parameter names) run on the fast path."""
        return sum(len(entry.plans) for entry in self._entries.values())

    def is_fast(self, statement: Any) -> bool:
        entry = self._entries.get(id(statement))
        return entry is not None and entry.statement is statement and bool(entry.plans)

    def execute(self, conn: Connection, statement: Any, parameters: Any = None) -> Any:
        plan = self._plan(statement, parameters)
        # (statement-level events see the statement object: SQLAlchemy's to run; the cursor's
        # events, echo and error wrapping are SQLAlchemy's own, in _cursor_execute)
        if plan is None or conn._has_events or self._events.before_execute \
                or self._events.after_execute \
                or not _SAFE_OPTIONS.issuperset(conn.get_execution_options()):
            return conn.execute(statement, parameters)
        try:
            args = plan.parameters(parameters)
        except Exception:  # (a missing parameter: raised as SQLAlchemy raises it)
            return conn.execute(statement, parameters)
        cursor = conn.connection.cursor()
        conn._cursor_execute(cursor, plan.sql, args)
        if plan.metadata is None:
            rowcount = cursor.rowcount
            cursor.close()
            return _Written(rowcount)
        # (SQLAlchemy takes an UPDATE or DELETE ... RETURNING's rowcount before its rows are
        # fetched: 0 on the stdlib driver, which counts the changes once the statement is done)
        counted = cursor.rowcount if plan.counts_first else None
        try:
            rows = cursor.fetchall()
        except BaseException as exc:
            conn._handle_dbapi_exception(exc, plan.sql, args, cursor, None)
        rowcount = cursor.rowcount if counted is None else counted
        cursor.close()
        return _RowsResult(plan.metadata, rows, rowcount)

    def _plan(self, statement: Any, parameters: Any) -> _Plan | None:
        """The statement's plan once it is hot, else None (SQLAlchemy runs it)."""
        if self._threshold is None:
            return None
        entries = self._entries
        entry = entries.get(id(statement))
        if entry is not None and entry.statement is statement:
            entries.move_to_end(id(statement))
        else:  # (a statement never seen, or one whose id was another's: a new entry)
            entries.pop(id(statement), None)
            entry = entries[id(statement)] = _Entry(
                statement, slow=not isinstance(statement, UpdateBase | Select)
                or bool(statement._execution_options))
            if len(entries) > self._size:
                entries.popitem(last=False)
        if entry.slow:
            return None
        if entry.uses < self._threshold:
            entry.uses += 1
            return None
        if parameters is None:
            keys: tuple[str, ...] = ()
        elif type(parameters) is dict:
            keys = tuple(parameters)
        else:  # executemany, or parameters of another shape
            entry.slow = True
            return None
        plan = entry.plans.get(keys)
        if plan is None:
            try:
                plan = entry.plans[keys] = _Plan(statement, keys, parameters, self._dialect)
            except Exception:
                entry.slow, entry.plans = True, {}
                return None
        return plan


_BY_ENGINE: weakref.WeakKeyDictionary[Engine, HotStatements] = weakref.WeakKeyDictionary()


def hot_statements(engine: Engine) -> HotStatements:
    """The engine's fast path (created on first use, with `FAST_AFTER_USES` as it is then)."""
    hot = _BY_ENGINE.get(engine)
    if hot is None:
        hot = _BY_ENGINE[engine] = HotStatements(engine, threshold=FAST_AFTER_USES)
    return hot
