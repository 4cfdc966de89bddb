"""Paid calls: a checkpoint before and after every call that may cost money
(template-owned: copier-agent-worker).

`await ctx.paid_call(name, fn, max_cost_usd=...)` reserves the maximum cost, commits an
`open` row, calls `fn`, then settles the real cost and stores the result in a `closed` row.
On a later attempt of the same job a closed call returns its stored result without calling
again; an open one means a worker died mid-call, so the charge may have happened: the job is
parked `in_doubt` and never replayed automatically.

The cost is `cost_usd` (a Decimal, or a function of the result); left out, an OpenAI or
Anthropic result is priced from its own model and usage (pricing.result_cost_usd), and a
result that cannot be priced counts the whole reservation, with a warning. A result that is
a pydantic model (every SDK response) is stored as JSON and comes back as the same type
(stored.py).

Errors from `fn` are sorted by whether the provider may have charged (provider_errors.py
reads any SDK's errors by status and class name; the whole table is in OPERATIONS):

| error from `fn`                                          | charged? | what happens              |
|----------------------------------------------------------|----------|---------------------------|
| a provider's 4xx, 429, 529, 500/502/503; never connected | no       | reservation released; the |
|   `NotCharged`, or a class given to `not_charged()`      |          | error goes to the runner  |
| timeouts and resets after sending, 504, unknown errors   | maybe    | reserved cost spent;      |
|                                                          |          | `in_doubt`                |

The original error is raised again, so `except openai.BadRequestError:` around
`ctx.paid_call` works; the runner then reads it the same way (a 429 waits for Retry-After
without using an attempt, a 400 fails the job at once, a 500 is retried). Turn the SDK's own
retries off (`max_retries=0`): retries happen at the job level, where they are recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, TypeVar

import structlog
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import budget_asks, budgets, events, provider_errors, spend, stored
from .db import transaction
from .errors import RateLimited
from .models import jobs, paid_calls

log = structlog.get_logger("paid_calls")
T = TypeVar("T")


class NotCharged(Exception):
    """Raise (or subclass) from a provider call that failed before the provider billed."""


class PaidCallInDoubt(BaseException):
    """A paid call may have been charged with no recorded outcome; the job must park.

    A BaseException, so an agent's `except Exception` cannot swallow it by accident.
    """


# How long a call's record write that a cancel reached (the attempt's timeout, an operator's
# stop, a worker stopping) may go on before it is abandoned, leaving the call `open`.
RECORD_GRACE_S = 10.0

# An upstream's 429 (RateLimited) is refused before billing too.
NOT_CHARGED: tuple[type[BaseException], ...] = (NotCharged, ConnectionRefusedError, RateLimited)


def not_charged(*errors: type[BaseException]) -> None:
    """Declare errors that are raised before the provider bills anything (for an SDK whose
    errors carry no HTTP status; provider_errors reads the ones that do)."""
    global NOT_CHARGED
    NOT_CHARGED = NOT_CHARGED + tuple(e for e in errors if e not in NOT_CHARGED)


Cost = Decimal | str | int | Callable[[Any], Decimal | str | int] | None


def charged(exc: BaseException) -> bool:
    """Whether a call that raised `exc` may have been billed (False: surely not)."""
    return not isinstance(exc, NOT_CHARGED) and provider_errors.read(exc) is None


@dataclass(frozen=True)
class PaidCall:
    """One recorded paid call of a job."""

    name: str
    attempt: int
    state: str
    max_cost_usd: Decimal
    cost_usd: Decimal | None
    started_at: datetime
    finished_at: datetime | None


@dataclass
class PaidCalls:
    """The paid-call checkpoint for one attempt of one job (what `ctx.paid_call` uses)."""

    engine: AsyncEngine
    job_id: str
    agent: str
    attempt: int
    encode: Callable[[Any], Any] = stored.to_record
    decode: Callable[[Any], Any] = stored.from_record
    # Told (agent, outcome) of every call: charged, reused, not_charged, in_doubt (metrics).
    observe: Callable[[str, str], None] = lambda agent, outcome: None
    # Paid calls the job may make over all its attempts (the agent's `max_paid_calls`).
    max_paid_calls: int | None = None
    # The job's `jobs.budget_id`: the budget its calls reserve under (budgets.py), if any.
    budget_id: str | None = None
    # What a call no budget or cap can cover does: "deny" the job, or "wait" for a person
    # on an approval named `budget` (the agent's `on_budget`; budget_asks.py).
    on_budget: str = "deny"
    # Calls of this attempt that may be recorded `open`: from their reservation until their
    # settle is written. When the attempt ends with one left (a settle's write failed, or the
    # agent caught that error and went on), the runner reads the record (runner.settled).
    unsettled: set[str] = field(default_factory=set)

    async def call(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        max_cost_usd: Decimal | str | int,
        cost_usd: Cost = None,
    ) -> Any:
        """Run `fn` at most once per job under `name`, within the spend caps."""
        max_micros = spend.to_micros(max_cost_usd)
        if cost_usd is not None and not callable(cost_usd):
            spend.to_micros(cost_usd)  # a wrong constant fails here, before anything is sent
        day = spend.utc_day(datetime.now(UTC))
        try:
            row = await self._reserve(name, max_micros, day)
        except spend.SpendDenied as denied:
            if self.on_budget != "wait" or denied.stop is None:
                raise
            await budget_asks.ask(self.engine, self.job_id, name, denied)
        if row is not None and row.state == "closed":
            self.observe(self.agent, "reused")
            return self.decode(row.result)
        if row is not None:
            self.observe(self.agent, "in_doubt")
            raise PaidCallInDoubt(
                f"paid call {name!r} of attempt {row.attempt} has no recorded outcome; "
                "the provider may have charged it"
            )
        started = time.monotonic()
        try:
            result = await fn()
        except BaseException as exc:
            if not charged(exc):
                await finish(self._forget(name, max_micros, day, time.monotonic() - started))
                self.observe(self.agent, "not_charged")
                raise
            await finish(self._park(name))
            self.observe(self.agent, "in_doubt")
            raise PaidCallInDoubt(
                f"paid call {name!r} failed with {type(exc).__name__} after it was sent; "
                "the provider may have charged it"
            ) from exc
        facts = {"duration_s": round(time.monotonic() - started, 3), **call_facts(result)}
        await finish(self._keep(name, result, cost_usd, max_micros, day, facts))
        return result

    async def _keep(
        self,
        name: str,
        result: Any,
        cost_usd: Cost,
        max_micros: int,
        day: date,
        facts: dict[str, Any],
    ) -> None:
        """Record a charged call's cost and result (PaidCallInDoubt when the result cannot
        be stored, or the call was parked while it ran)."""
        cost_micros = self._cost_micros(name, result, cost_usd, max_micros)
        try:
            record = self.encode(result)
        except stored.Unstorable as exc:
            await self._park(name, cost_micros=cost_micros)
            self.observe(self.agent, "in_doubt")
            raise PaidCallInDoubt(
                f"paid call {name!r} was charged ${spend.to_usd(cost_micros)}, but {exc}; "
                "return a dict or the SDK's response object from fn"
            ) from exc
        if not await self._close(name, max_micros, cost_micros, day, record, facts):
            self.observe(self.agent, "in_doubt")
            raise PaidCallInDoubt(
                f"paid call {name!r} was parked in_doubt while it ran (its job's lease "
                "expired and recovery took the job over); its result was not recorded"
            )
        self.observe(self.agent, "charged")

    async def _reserve(self, name: str, max_micros: int, day: date) -> Any:
        """`_find_or_open`, written to its end when a cancel reaches the attempt meanwhile
        (`finish`). Cut in its commit, the call would stay recorded `open`, and its job in
        doubt, for a call never sent: one it opened is given back before the cancel goes on."""
        try:
            return await finish(self._find_or_open(name, max_micros, day))
        except asyncio.CancelledError:
            if name in self.unsettled:
                await finish(self._forget(name, max_micros, day, duration_s=0.0))
            raise

    async def _find_or_open(self, name: str, max_micros: int, day: date) -> Any:
        """The call's record, or None once it is reserved and recorded open (SpendDenied,
        with nothing written, when a budget or cap cannot cover it)."""
        async with transaction(self.engine) as conn:
            row = (
                await conn.execute(
                    select(paid_calls.c.state, paid_calls.c.result, paid_calls.c.attempt).where(
                        paid_calls.c.job_id == self.job_id, paid_calls.c.name == name
                    )
                )
            ).first()
            if row is None:
                await self._open(conn, name, max_micros, day)
                # From before the commit: a commit whose answer is lost may have written it.
                self.unsettled.add(name)
        return row

    def _cost_micros(self, name: str, result: Any, cost_usd: Cost, max_micros: int) -> int:
        """The call's cost: given, or priced from the result; an unpriced result counts the
        whole reservation (never zero)."""
        try:
            if cost_usd is not None:
                return spend.to_micros(cost_usd(result) if callable(cost_usd) else cost_usd)
            from . import pricing  # the price table loads on the first call that needs it

            return spend.to_micros(pricing.result_cost_usd(result))
        except Exception as exc:  # noqa: BLE001 - the call was charged: its result is kept
            # An unknown price, or a `cost_usd` that raised or gave no Decimal: the call
            # still closes with its result, counted at the whole reservation.
            reason = str(exc)
            if cost_usd is not None:
                failed = f"{type(exc).__name__}: {exc}"
                reason = f"cost_usd failed ({failed}); give a Decimal, str or int in USD"
            log.warning(
                "paid_call_not_priced",
                job_id=self.job_id,
                call=name,
                reason=reason,
                counted_usd=str(spend.to_usd(max_micros)),
            )
            return max_micros

    async def is_settled(self, name: str) -> bool:
        """Whether the call `name` of this job already has its stored result."""
        async with self.engine.connect() as conn:
            state = await conn.scalar(
                select(paid_calls.c.state).where(
                    paid_calls.c.job_id == self.job_id, paid_calls.c.name == name
                )
            )
        return state == "closed"

    async def _open(self, conn: AsyncConnection, name: str, max_micros: int, day: date) -> None:
        """Reserve `max_micros` under the job's budgets and the caps and record the call as
        open, in `conn`'s transaction (a refused reservation raises SpendDenied and writes
        nothing). The job's own rows are written first and the shared budget and cap rows
        last, so their locks are held only for the reservation and the commit: every
        concurrent call of the agent waits on them. Budgets before caps, in every
        transaction: one lock order, no deadlock."""
        if self.max_paid_calls is not None:
            await self._check_count(conn, name, self.max_paid_calls)
        await conn.execute(
            insert(paid_calls).values(
                job_id=self.job_id,
                name=name,
                agent=self.agent,
                attempt=self.attempt,
                day=day,
                state="open",
                max_cost_micros=max_micros,
                started_at=datetime.now(UTC),
            )
        )
        opened = {"name": name, "max_usd": str(spend.to_usd(max_micros))}
        await events.append(
            conn,
            self.job_id,
            [events.New("paid_call_opened", opened, self.attempt)],
            now=datetime.now(UTC),
        )
        await budgets.reserve(conn, self.job_id, self.budget_id, max_micros)
        await spend.reserve(conn, agent=self.agent, max_micros=max_micros, day=day)

    async def _check_count(self, conn: AsyncConnection, name: str, most: int) -> None:
        """Refuse the call past `most` (the agent's `max_paid_calls`) for this job. Every call
        that was or may have been charged counts, over all attempts; one refused before it
        was sent (`NotCharged`) leaves no row and does not, nor does one a rerun copied from
        the job it reruns (attempt 0: made and paid by that job, reruns.py)."""
        # A write to the job's row first: two calls of one job opened at once are counted one
        # after the other (on SQLite it also takes the write lock before any read).
        await conn.execute(update(jobs).where(jobs.c.id == self.job_id).values(id=jobs.c.id))
        made = await conn.scalar(
            select(func.count())
            .select_from(paid_calls)
            .where(paid_calls.c.job_id == self.job_id, paid_calls.c.attempt > 0)
        )
        if int(made or 0) >= most:
            raise spend.SpendDenied(
                f"agent {self.agent} allows {most} paid calls per job (max_paid_calls) and "
                f"this job has made {made}: paid call {name!r} was not sent"
            )

    async def _close(
        self,
        name: str,
        max_micros: int,
        cost_micros: int,
        day: date,
        result: Any,
        facts: dict[str, Any],
    ) -> bool:
        """Record the call `closed` with its cost and result and settle its reservation;
        False, with nothing written, when it is no longer `open`: parked `in_doubt` while it
        ran, its reservation counted as spent there (recovery.rescue)."""
        async with transaction(self.engine) as conn:
            closed = await conn.execute(
                update(paid_calls)
                .where(
                    paid_calls.c.job_id == self.job_id,
                    paid_calls.c.name == name,
                    paid_calls.c.state == "open",
                )
                .values(
                    state="closed",
                    cost_micros=cost_micros,
                    result=result,
                    finished_at=datetime.now(UTC),
                )
            )
            if closed.rowcount == 0:
                return False
            settled = {"name": name, "state": "closed", "cost_usd": str(spend.to_usd(cost_micros))}
            await self._event(conn, {**settled, **facts})
            # The shared rows last, as in _open.
            await budgets.settle(
                conn, self.budget_id, reserved_micros=max_micros, cost_micros=cost_micros
            )
            await spend.settle(
                conn, agent=self.agent, day=day, reserved_micros=max_micros, cost_micros=cost_micros
            )
        self.unsettled.discard(name)
        return True

    async def _event(self, conn: AsyncConnection, data: dict[str, Any]) -> None:
        """The call's `paid_call_settled` event, in the transaction that settles it."""
        settled = events.New("paid_call_settled", data, self.attempt)
        await events.append(conn, self.job_id, [settled], now=datetime.now(UTC))

    async def _forget(self, name: str, max_micros: int, day: date, duration_s: float) -> None:
        """Delete the `open` record of a call the provider did not charge and release its
        reservation; nothing, when it was parked `in_doubt` while it ran (recovery.rescue
        counted it there: an operator's `not-charged` gives it back)."""
        async with transaction(self.engine) as conn:
            forgotten = await conn.execute(
                paid_calls.delete().where(
                    paid_calls.c.job_id == self.job_id,
                    paid_calls.c.name == name,
                    paid_calls.c.state == "open",
                )
            )
            if forgotten.rowcount == 0:
                return
            refused = {"name": name, "state": "not_charged", "duration_s": round(duration_s, 3)}
            await self._event(conn, refused)
            await budgets.settle(conn, self.budget_id, reserved_micros=max_micros, cost_micros=0)
            await spend.release(conn, agent=self.agent, day=day, reserved_micros=max_micros)
        self.unsettled.discard(name)

    async def _park(self, name: str, cost_micros: int | None = None) -> None:
        async with transaction(self.engine) as conn:
            await park_open_calls(conn, self.job_id, only=name, cost_micros=cost_micros)
        self.unsettled.discard(name)


async def finish(write: Coroutine[Any, Any, T]) -> T:
    """Run a paid call's record write to its end even when a cancel reaches the attempt
    meanwhile (its timeout, an operator's stop, a worker stopping), then let the cancel go
    on. Cut halfway, the write would leave a call the provider answered (or surely did not
    charge) recorded `open`, and its job in doubt: a paid answer lost, or a charge counted
    that never happened. A write still running RECORD_GRACE_S after the cancel is abandoned
    (the database is out of reach): the call stays `open`, as a killed worker leaves it.
    A write that parks the call (PaidCallInDoubt) says so in place of the cancel."""
    task = asyncio.ensure_future(write)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        until = time.monotonic() + RECORD_GRACE_S
        while not task.done() and time.monotonic() < until:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task}, timeout=until - time.monotonic())
        if not task.done():
            task.cancel()
            log.warning("paid_call_record_abandoned", waited_s=RECORD_GRACE_S)
        elif not task.cancelled():
            error = task.exception()  # a failed write leaves the call `open`: runner.settled
            if isinstance(error, PaidCallInDoubt):
                raise error from None
        raise


async def park_open_calls(
    conn: AsyncConnection, job_id: str, only: str | None = None, cost_micros: int | None = None
) -> int:
    """Mark a job's open calls `in_doubt` and count their whole reservation as spent (or
    `cost_micros`, when the call's cost is known but its result could not be stored)."""
    stmt = (
        update(paid_calls)
        .where(paid_calls.c.job_id == job_id, paid_calls.c.state == "open")
        .values(
            state="in_doubt",
            cost_micros=paid_calls.c.max_cost_micros if cost_micros is None else cost_micros,
            finished_at=datetime.now(UTC),
        )
        .returning(
            paid_calls.c.name,
            paid_calls.c.attempt,
            paid_calls.c.agent,
            paid_calls.c.day,
            paid_calls.c.max_cost_micros,
            paid_calls.c.cost_micros,
        )
    )
    if only is not None:
        stmt = stmt.where(paid_calls.c.name == only)
    rows = (await conn.execute(stmt)).all()
    budget_id = await budgets.covering(conn, job_id) if rows else None
    for row in rows:
        await budgets.settle(
            conn, budget_id, reserved_micros=row.max_cost_micros, cost_micros=row.cost_micros
        )
        await spend.settle(
            conn,
            agent=row.agent,
            day=row.day,
            reserved_micros=row.max_cost_micros,
            cost_micros=row.cost_micros,
        )
    parked = [
        events.New(
            "paid_call_settled",
            {"name": row.name, "state": "in_doubt", "cost_usd": str(spend.to_usd(row.cost_micros))},
            row.attempt,
        )
        for row in rows
    ]
    await events.append(conn, job_id, parked, now=datetime.now(UTC))
    return len(rows)


def call_facts(result: Any) -> dict[str, Any]:
    """The model and token counts an OpenAI or Anthropic result reports, for its event.

    >>> call_facts({"model": "gpt-4o", "usage": {"prompt_tokens": 9, "completion_tokens": 1}})
    {'model': 'gpt-4o', 'input_tokens': 9, 'output_tokens': 1}
    >>> call_facts({"answer": 42})
    {}
    """
    facts: dict[str, Any] = {}
    model = _field(result, "model")
    if isinstance(model, str):
        facts["model"] = model
    usage = _field(result, "usage")
    if usage is not None:
        from . import pricing  # as in _cost_micros: loaded only when a result has usage

        try:
            counted = pricing.usage_of(usage)
            facts["input_tokens"] = int(counted.input_tokens or 0)
            facts["output_tokens"] = int(counted.output_tokens or 0)
        except (TypeError, ValueError, AttributeError):
            pass  # a usage of another shape: the event goes without its tokens
    return facts


def _field(source: Any, key: str) -> Any:
    return source.get(key) if isinstance(source, dict) else getattr(source, key, None)


async def has_open_call(conn: AsyncConnection, job_id: str) -> bool:
    row = (
        await conn.execute(
            select(paid_calls.c.id)
            .where(paid_calls.c.job_id == job_id, paid_calls.c.state == "open")
            .limit(1)
        )
    ).first()
    return row is not None


async def states_of(conn: AsyncConnection, job_id: str) -> set[str]:
    """The states of the job's recorded paid calls: `open`, `closed`, `in_doubt`."""
    rows = await conn.execute(
        select(paid_calls.c.state).where(paid_calls.c.job_id == job_id).distinct()
    )
    return {str(state) for (state,) in rows}


async def calls_of(conn: AsyncConnection, job_id: str) -> list[PaidCall]:
    rows = await conn.execute(
        select(paid_calls).where(paid_calls.c.job_id == job_id).order_by(paid_calls.c.id)
    )
    return [
        PaidCall(
            name=row.name,
            attempt=row.attempt,
            state=row.state,
            max_cost_usd=spend.to_usd(row.max_cost_micros),
            cost_usd=None if row.cost_micros is None else spend.to_usd(row.cost_micros),
            started_at=row.started_at,
            finished_at=row.finished_at,
        )
        for row in rows
    ]
