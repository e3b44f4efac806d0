"""Who used what: each named key's requests, errors and tokens, per model entry, by the minute,
kept in the state directory, and the budgets that read them. Stdlib only.

Every worker records what its requests used (``Ledger.record``: in memory, on the event loop)
and one thread per worker adds it to ``usage.sqlite3`` once a second, so a request never waits
on the disk. SQLite's write-ahead log lets every worker of the daemon write the one file and the
daemon read it while they do; a worker restart or a daemon restart loses at most the last
second of counts not yet written (a clean stop writes them). A key's budget is checked against
all of its use, on every worker: the sums the thread read after its last write (never older
than a second or two), plus what this worker recorded since; requests running on other workers
are counted when they end, so a budget can be overrun by what runs at once when it runs out.

Days and months are the daemon machine's local calendar: a daily budget resets at local midnight.
"""

from __future__ import annotations

import calendar
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path

FILE = "usage.sqlite3"
FLUSH_S = 1.0  # how often a worker's counts reach the file, and its budgets' sums are read again
OPEN_KEY = ""  # the "key" of requests to an entry that takes none

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    minute INTEGER NOT NULL,           -- Unix time // 60
    key TEXT NOT NULL,                 -- the key's name; '' on an open entry
    model TEXT NOT NULL,               -- the model entry's name
    requests INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, minute, model)
)
"""
COUNTS = ("requests", "errors", "input_tokens", "cached_tokens", "output_tokens")
UPSERT = (
    f"INSERT INTO usage (minute, key, model, {', '.join(COUNTS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    f"ON CONFLICT (key, minute, model) DO UPDATE SET {', '.join(f'{c} = {c} + excluded.{c}' for c in COUNTS)}"
)


@dataclass
class Counts:
    """What some requests used. ``input_tokens`` counts every prompt token, cached or not;
    ``cached_tokens`` those of them the prefix cache served."""

    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def add(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def tokens(self) -> int:
        """What a token budget counts: every prompt token and every generated one."""
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# -- budgets: plain values and pure functions --------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """A key's budget (``api_keys.NAME.budget``); 0: no limit of that kind."""

    tokens_per_day: int = 0
    tokens_per_month: int = 0
    requests_per_day: int = 0

    @property
    def limited(self) -> bool:
        return bool(self.tokens_per_day or self.tokens_per_month or self.requests_per_day)


@dataclass(frozen=True)
class Spent:
    """A key's use in the current day and month."""

    day: Counts = field(default_factory=Counts)
    month: Counts = field(default_factory=Counts)


@dataclass(frozen=True)
class Overrun:
    """The budget a key has used up, and when it resets."""

    limit: str  # its name in the config: tokens_per_day, tokens_per_month, requests_per_day
    allowed: int
    used: int
    resets: datetime  # local time, with its offset

    def message(self, key: str) -> str:
        unit = "requests" if self.limit.startswith("requests") else "tokens"
        period = "day" if self.limit.endswith("day") else "month"
        return (
            f"the key {key!r} has used its budget of {self.allowed:,} {unit} per {period} "
            f"({self.used:,} used); it resets at {self.resets.isoformat(timespec='seconds')}"
        )

    def retry_after(self, now: float) -> int:
        return max(1, int(self.resets.timestamp() - now) + 1)


def overrun(budget: Budget, spent: Spent, now: float) -> Overrun | None:
    """The first of ``budget``'s limits ``spent`` has reached, or None: a request may start."""
    day, month = period_starts(now)
    checks = (
        ("requests_per_day", budget.requests_per_day, spent.day.requests, next_day(day)),
        ("tokens_per_day", budget.tokens_per_day, spent.day.tokens, next_day(day)),
        ("tokens_per_month", budget.tokens_per_month, spent.month.tokens, next_month(month)),
    )
    for name, allowed, used, resets in checks:
        if allowed and used >= allowed:
            return Overrun(name, allowed, used, resets)
    return None


def period_starts(now: float) -> tuple[datetime, datetime]:
    """The local day's and month's first moments around ``now`` (aware datetimes)."""
    local = datetime.fromtimestamp(now).astimezone()
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)


def next_day(day: datetime) -> datetime:
    # Local midnight after ``day``'s, across a daylight-saving change too.
    return (day.replace(tzinfo=None) + timedelta(days=1)).astimezone()


def next_month(month: datetime) -> datetime:
    days = calendar.monthrange(month.year, month.month)[1]
    return (month.replace(tzinfo=None) + timedelta(days=days)).astimezone()


def left(budget: Budget, spent: Spent) -> dict[str, int | None]:
    """What a key has left of each limit (None: no limit of that kind)."""
    return {
        "tokens_per_day": max(0, budget.tokens_per_day - spent.day.tokens) if budget.tokens_per_day else None,
        "tokens_per_month": max(0, budget.tokens_per_month - spent.month.tokens) if budget.tokens_per_month else None,
        "requests_per_day": max(0, budget.requests_per_day - spent.day.requests) if budget.requests_per_day else None,
    }


# -- the file ------------------------------------------------------------------------------------


def connect(path: Path) -> sqlite3.Connection:
    """The usage file, made if missing (write-ahead log: workers write while the daemon reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), timeout=10, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(SCHEMA)
    return db


def totals(db: sqlite3.Connection, *, since: float, key: str | None = None) -> dict[tuple[str, str], Counts]:
    """Use since ``since`` (Unix time), by (key, model); one key's only where ``key`` is given."""
    query = f"SELECT key, model, {', '.join(f'SUM({c})' for c in COUNTS)} FROM usage WHERE minute >= ?"
    args: list[object] = [int(since // 60)]
    if key is not None:
        query += " AND key = ?"
        args.append(key)
    rows = db.execute(query + " GROUP BY key, model", args).fetchall()
    return {(k, m): Counts(*values) for k, m, *values in rows}


def spent_from(db: sqlite3.Connection, key: str, now: float) -> Spent:
    """``key``'s use in the current local day and month, every model together."""
    day, month = period_starts(now)
    spent = Spent()
    for (_, _), counts in totals(db, since=month.timestamp(), key=key).items():
        spent.month.add(counts)
    for (_, _), counts in totals(db, since=day.timestamp(), key=key).items():
        spent.day.add(counts)
    return spent


class Ledger:
    """One worker's usage: recorded on the event loop, written and read back by its own thread."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, str, str], Counts] = {}  # (minute, key, model): not yet written
        # A budgeted key's use, every worker's: its sums at the thread's last read, what this worker
        # wrote since (not in those sums yet) and what it recorded since it last wrote.
        self._spent: dict[str, Spent] = {}
        self._written: dict[str, Counts] = {}
        self._recorded: dict[str, Counts] = {}
        self.process: dict[tuple[str, str], Counts] = {}  # since this worker started, by (key, model): /metrics
        self._db = connect(path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllmmlxd-usage", daemon=True)
        self._thread.start()

    def record(self, key: str, model: str, counts: Counts) -> None:
        minute = int(self._clock() // 60)
        with self._lock:
            self._pending.setdefault((minute, key, model), Counts()).add(counts)
            self._recorded.setdefault(key, Counts()).add(counts)
            self.process.setdefault((key, model), Counts()).add(counts)

    def spent(self, key: str) -> Spent:
        """``key``'s use this day and month, every worker's: read from the file the first time the
        key asks (its first request that has a budget), then kept fresh by the thread."""
        with self._lock:
            if key not in self._spent:  # once a key: a short read on the caller's thread
                self._flush(self._db)
                self._spent[key] = spent_from(self._db, key, self._clock())
                self._written.pop(key, None)  # (in what was just read)
            known = self._spent[key]
            extra = [c for c in (self._written.get(key), self._recorded.get(key)) if c is not None]
            day, month = Counts(), Counts()
            for c in (known.day, *extra):
                day.add(c)
            for c in (known.month, *extra):
                month.add(c)
        return Spent(day, month)

    def sync(self) -> None:
        """Write what was recorded and read the budgeted keys' sums now (what the thread does each
        second), all under the lock: for a caller that must see the file current (tests, a report)."""
        with self._lock:
            self._flush(self._db)
            now = self._clock()
            for key in list(self._spent):
                self._spent[key] = spent_from(self._db, key, now)
                self._written.pop(key, None)

    def snapshot(self) -> dict[tuple[str, str], Counts]:
        """This worker's use since it started, by (key, model): a copy."""
        with self._lock:
            return {k: Counts(**c.as_dict()) for k, c in self.process.items()}

    def close(self) -> None:
        """Write what is pending and stop the thread."""
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._flush(self._db)
        with contextlib.suppress(sqlite3.Error):
            self._db.close()

    def _run(self) -> None:
        db = connect(self.path)  # the thread's own connection: one is never used by two threads at once
        try:
            while not self._stop.wait(FLUSH_S):
                with contextlib.suppress(sqlite3.Error):  # a locked or full disk: the counts wait for the next turn
                    self._turn(db)
        finally:
            db.close()

    def _turn(self, db: sqlite3.Connection) -> None:
        """Write what was recorded, then read the budgeted keys' sums again (which now hold it)."""
        with self._lock:
            self._flush(db)
            keys = list(self._spent)
        now = self._clock()
        fresh = {key: spent_from(db, key, now) for key in keys}
        with self._lock:
            for key, spent in fresh.items():
                self._spent[key] = spent
                self._written.pop(key, None)

    def _flush(self, db: sqlite3.Connection) -> None:
        """Write the pending counts (the caller holds the lock)."""
        if self._pending:
            rows = [(m, k, model, *c.as_dict().values()) for (m, k, model), c in self._pending.items()]
            with _transaction(db):
                db.executemany(UPSERT, rows)
            self._pending.clear()
        for key, counts in self._recorded.items():
            self._written.setdefault(key, Counts()).add(counts)
        self._recorded.clear()


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
