"""Spend caps: reserve before a paid call, settle after; a missing cap denies
(template-owned: copier-agent-worker).

Money is integer micro-dollars in the database and `Decimal` in Python; a float is refused.
A reservation is one guarded UPDATE per cap row (`... WHERE spent + reserved + :max <= cap`),
the agent's row first and then the global row, in one transaction: concurrent workers wait
on the row lock and re-check the condition, so together they can never overshoot a cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import audit
from .db import transaction
from .models import GLOBAL, spend_caps, spend_days
from .money import usd

MICROS = Decimal(1_000_000)
MICRO_USD = Decimal("0.000001")
# The largest daily cap accepted: far above any real budget, far inside a BIGINT of micros.
MAX_CAP_USD = Decimal(1_000_000)


@dataclass(frozen=True)
class Stop:
    """What refused a reservation, for an agent that waits for a person (`on_budget:
    wait`): a job's budget, its tree's, an agent's daily cap or the global one."""

    kind: str  # "job", "tree", "agent" or "global"
    target: str  # the job whose budget it is, or the agent (GLOBAL for the global cap)
    asked_micros: int
    left_micros: int
    day: date | None = None  # the UTC day of a daily cap

    def as_dict(self) -> dict[str, str | int | None]:
        return {
            "kind": self.kind,
            "target": self.target,
            "asked_usd": str(to_usd(self.asked_micros)),
            "left_usd": str(to_usd(max(self.left_micros, 0))),
            "day": None if self.day is None else self.day.isoformat(),
        }


class SpendDenied(BaseException):
    """The spend policy refused a paid call; the message is the reason stored on the job.

    `stop` says which budget or cap refused it, when one did (not for a missing cap or the
    runaway guard). A BaseException, so an agent's `except Exception` cannot swallow it.
    """

    def __init__(self, message: str, stop: Stop | None = None) -> None:
        super().__init__(message)
        self.stop = stop


class CapChangeRefused(ValueError):
    """A cap change refused before anything was written (an amount out of range, an agent
    that makes no paid calls, a raise without an approver); the message says what to do."""


def parse_usd(text: str, *, field: str = "usd") -> Decimal:
    """A daily cap in dollars read from text: from 0 to MAX_CAP_USD, in whole
    micro-dollars (finer is refused, never rounded to 0). The CLI, the API and the
    console read a cap here; CapChangeRefused names `field` and the range.

    >>> parse_usd("25.00")
    Decimal('25.00')
    >>> for text in ("99999999999999999999999", "0.0000001", "ten"):
    ...     try:
    ...         parse_usd(text)
    ...     except CapChangeRefused as exc:
    ...         print(exc)
    usd must be from 0 to 1000000 dollars, like "25.00" (got '99999999999999999999999')
    usd is finer than a micro-dollar (0.000001); round it to 6 decimals (got '0.0000001')
    usd must be a number of dollars from 0 to 1000000, like "25.00" (got 'ten')
    """
    try:
        amount = Decimal(text)
    except ArithmeticError:  # decimal.InvalidOperation: not a number
        amount = None
    if amount is None or amount.is_nan():
        raise CapChangeRefused(
            f'{field} must be a number of dollars from 0 to {MAX_CAP_USD}, like "25.00" '
            f"(got {_shown(text)})"
        )
    if not 0 <= amount <= MAX_CAP_USD:  # also refuses Infinity
        raise CapChangeRefused(
            f'{field} must be from 0 to {MAX_CAP_USD} dollars, like "25.00" (got {_shown(text)})'
        )
    if amount != amount.quantize(MICRO_USD):
        raise CapChangeRefused(
            f"{field} is finer than a micro-dollar ({MICRO_USD}); round it to 6 decimals "
            f"(got {_shown(text)})"
        )
    return amount.copy_abs()  # -0 is 0


def _shown(text: str, most: int = 40) -> str:
    quoted = repr(text)
    return quoted if len(quoted) <= most else quoted[: most - 3] + "..."


def to_micros(usd: Decimal | int | str) -> int:
    """Dollars to integer micro-dollars, rounding half-even at the sixth decimal.

    >>> to_micros(Decimal("0.1")) + to_micros("0.2") == to_micros("0.3")
    True
    >>> to_micros(0.1)
    Traceback (most recent call last):
    TypeError: money must be a Decimal, int or str, not float (got 0.1)
    """
    if isinstance(usd, float):
        raise TypeError(f"money must be a Decimal, int or str, not float (got {usd!r})")
    value = Decimal(usd) if not isinstance(usd, Decimal) else usd
    return int((value * MICROS).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def to_usd(micros: int) -> Decimal:
    """Micro-dollars to dollars, exactly.

    >>> to_usd(1_234_500), to_usd(60_000_000), to_usd(0)
    (Decimal('1.2345'), Decimal('60'), Decimal('0'))
    """
    # An exact quotient keeps the smallest exponent that holds it: 60, not normalize()'s 6E+1.
    return Decimal(micros) / MICROS


def cap_label(agent: str) -> str:
    """How a person reads a cap's key: an agent's name, or the global cap (GLOBAL, '*')
    named as such.

    >>> cap_label("draft"), cap_label(GLOBAL)
    ('draft', 'all agents (global)')
    """
    return "all agents (global)" if agent == GLOBAL else agent


def cap_changed(agent: str, old: Decimal | None, new: Decimal) -> str:
    """What `set_cap` did, as the console and the CLI tell it.

    >>> cap_changed("draft", None, Decimal("25")), cap_changed(GLOBAL, Decimal("5"), Decimal("0.5"))
    ('daily cap of draft: none -> $25.00', 'daily cap of *: $5.00 -> $0.50')
    """
    return f"daily cap of {agent}: {'none' if old is None else usd(old)} -> {usd(new)}"


def utc_day(now: datetime) -> date:
    return now.astimezone(UTC).date()


@dataclass(frozen=True)
class Cap:
    """An agent's (or the global) daily cap and today's use of it."""

    agent: str
    cap_usd: Decimal
    reserved_usd: Decimal
    spent_usd: Decimal

    @property
    def remaining_usd(self) -> Decimal:
        """What may still be reserved today; never negative (see `over_by_usd`)."""
        return max(self.cap_usd - self.reserved_usd - self.spent_usd, Decimal(0))

    @property
    def over_by_usd(self) -> Decimal:
        """How far use is past the cap (a cap lowered below what was already spent).

        >>> Cap("a", Decimal("1"), Decimal("0"), Decimal("1.5")).over_by_usd
        Decimal('0.5')
        """
        return max(self.reserved_usd + self.spent_usd - self.cap_usd, Decimal(0))

    def as_dict(self, day: date) -> dict[str, str]:
        """JSON-ready, money as strings: what `caps show --json` and GET /api/caps give."""
        return {
            "agent": self.agent,
            "day": day.isoformat(),
            "cap_usd": str(self.cap_usd),
            "reserved_usd": str(self.reserved_usd),
            "spent_usd": str(self.spent_usd),
            "remaining_usd": str(self.remaining_usd),
            "over_by_usd": str(self.over_by_usd),
        }


async def reserve(conn: AsyncConnection, *, agent: str, max_micros: int, day: date) -> None:
    """Reserve `max_micros` against the agent's cap and the global cap, or raise SpendDenied.

    Call inside a transaction: a refusal by the global cap must roll back the agent's
    reservation, so raise out of the transaction block.
    """
    # Write first: on SQLite this takes the write lock before any read, so two workers
    # never both read and then both try to upgrade to writing (an instant "database locked").
    for key in (agent, GLOBAL):
        await _ensure_day_row(conn, day, key)
    caps = await _caps(conn, [agent, GLOBAL])
    if agent not in caps:
        raise SpendDenied(f"no spend cap set for agent {agent}: set one with `caps set`")
    for key in (agent, GLOBAL):
        if key not in caps:
            continue
        if not await _reserve_row(conn, day, key, max_micros, caps[key]):
            used, raised = await _used(conn, day, key), await _raised(conn, day, key)
            who = f"agent {agent}" if key == agent else "the global cap"
            cap = caps[key] + raised
            stop = Stop("agent" if key == agent else "global", key, max_micros, cap - used, day)
            raise SpendDenied(
                f"daily cap reached for {who}: ${to_usd(cap)} cap, ${to_usd(used)} "
                f"reserved or spent on {day.isoformat()}, ${to_usd(max_micros)} more asked",
                stop,
            )


async def settle(
    conn: AsyncConnection, *, agent: str, day: date, reserved_micros: int, cost_micros: int
) -> None:
    """Turn a reservation into spend: `cost` is spent, the rest of the reservation released."""
    for key in await _capped_keys(conn, agent):
        await conn.execute(
            update(spend_days)
            .where(spend_days.c.day == day, spend_days.c.agent == key)
            .values(
                reserved_micros=spend_days.c.reserved_micros - reserved_micros,
                spent_micros=spend_days.c.spent_micros + cost_micros,
            )
        )


async def release(conn: AsyncConnection, *, agent: str, day: date, reserved_micros: int) -> None:
    """Give a reservation back: the call was definitely not charged."""
    await settle(conn, agent=agent, day=day, reserved_micros=reserved_micros, cost_micros=0)


async def refund(conn: AsyncConnection, *, agent: str, day: date, micros: int) -> None:
    """Take back spend counted for a call the provider did not bill (an operator checked)."""
    await settle(conn, agent=agent, day=day, reserved_micros=0, cost_micros=-micros)


async def has_cap(conn: AsyncConnection, agent: str) -> bool:
    return agent in await _caps(conn, [agent])


async def exhausted(conn: AsyncConnection, agent: str, day: date) -> str | None:
    """Why a paid agent may not start at all today (no cap, or nothing left), or None."""
    caps = await _caps(conn, [agent, GLOBAL])
    if agent not in caps:
        return f"no spend cap set for agent {agent}: set one with `caps set`"
    for key, cap in caps.items():
        used = await _used(conn, day, key)
        cap += await _raised(conn, day, key)
        if used >= cap:
            who = f"agent {agent}" if key == agent else "the global cap"
            return f"daily cap reached for {who}: ${to_usd(cap)} cap, ${to_usd(used)} used"
    return None


# Caps: seeded from the answers, then changed only through set_cap (audited). -------------


async def seed_caps(engine: AsyncEngine, answers: Mapping[str, Decimal | None]) -> list[str]:
    """Insert a cap row for every answered cap that has none yet; returns the agents seeded."""
    seeded: list[str] = []
    now = datetime.now(UTC)
    async with transaction(engine) as conn:
        existing = await _caps(conn, list(answers))
        for agent, cap in answers.items():
            if cap is None or agent in existing:
                continue
            await conn.execute(
                spend_caps.insert().values(
                    agent=agent, cap_micros=to_micros(cap), updated_at=now, updated_by="answers"
                )
            )
            await audit.record(
                conn,
                actor="template answers",
                action="cap_seeded",
                target=agent,
                details={"cap_usd": str(cap)},
                now=now,
            )
            seeded.append(agent)
    return seeded


async def set_cap(
    engine: AsyncEngine,
    agent: str,
    cap_usd: Decimal,
    *,
    approved_by: str | None,
    reason: str | None = None,
) -> tuple[Decimal | None, Decimal]:
    """Change a daily cap; raising it (or setting a first cap) needs `approved_by`.

    Returns (old cap or None, new cap). The change and its audit row commit together.
    """
    cap_usd = parse_usd(str(cap_usd), field="a cap")
    now = datetime.now(UTC)
    new = to_micros(cap_usd)
    async with transaction(engine) as conn:
        old = (await _caps(conn, [agent])).get(agent)
        raising = old is None or new > old
        if raising and not approved_by:
            raise CapChangeRefused(
                f"raising the cap of {agent} needs --approved-by NAME (who approved the spend)"
            )
        actor = approved_by or "operator"
        dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        stmt = dialect_insert(spend_caps).values(
            agent=agent, cap_micros=new, updated_at=now, updated_by=actor
        )
        await conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[spend_caps.c.agent],
                set_={"cap_micros": new, "updated_at": now, "updated_by": actor},
            )
        )
        await audit.record(
            conn,
            actor=actor,
            action="cap_raised" if raising else "cap_lowered",
            target=agent,
            details={
                "old_cap_usd": None if old is None else str(to_usd(old)),
                "new_cap_usd": str(to_usd(new)),
                "reason": reason,
            },
            now=now,
        )
    return (None if old is None else to_usd(old)), to_usd(new)


async def caps_for_day(conn: AsyncConnection, day: date) -> list[Cap]:
    """Every cap with its use on `day`, agents by name, the global cap last."""
    rows = await conn.execute(
        select(
            spend_caps.c.agent,
            spend_caps.c.cap_micros,
            spend_days.c.reserved_micros,
            spend_days.c.spent_micros,
            spend_days.c.raised_micros,
        ).select_from(
            spend_caps.outerjoin(
                spend_days,
                (spend_days.c.agent == spend_caps.c.agent) & (spend_days.c.day == day),
            )
        )
    )
    caps = [
        Cap(
            row.agent,
            to_usd(row.cap_micros + (row.raised_micros or 0)),
            to_usd(row.reserved_micros or 0),
            to_usd(row.spent_micros or 0),
        )
        for row in rows
    ]
    return sorted(caps, key=lambda cap: (cap.agent == GLOBAL, cap.agent))


# Internals --------------------------------------------------------------------------------


async def _caps(conn: AsyncConnection, agents: list[str]) -> dict[str, int]:
    rows = await conn.execute(
        select(spend_caps.c.agent, spend_caps.c.cap_micros).where(spend_caps.c.agent.in_(agents))
    )
    return {row.agent: int(row.cap_micros) for row in rows}


async def _capped_keys(conn: AsyncConnection, agent: str) -> list[str]:
    caps = await _caps(conn, [agent, GLOBAL])
    return [key for key in (agent, GLOBAL) if key in caps]


async def _ensure_day_row(conn: AsyncConnection, day: date, key: str) -> None:
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    await conn.execute(
        dialect_insert(spend_days)
        .values(day=day, agent=key, reserved_micros=0, spent_micros=0)
        .on_conflict_do_nothing()
    )


async def _reserve_row(
    conn: AsyncConnection, day: date, key: str, max_micros: int, cap_micros: int
) -> bool:
    c = spend_days.c
    result = await conn.execute(
        update(spend_days)
        .where(
            c.day == day,
            c.agent == key,
            c.spent_micros + c.reserved_micros + max_micros <= cap_micros + c.raised_micros,
        )
        .values(reserved_micros=c.reserved_micros + max_micros)
    )
    return result.rowcount == 1


async def raise_day(conn: AsyncConnection, *, key: str, day: date, micros: int) -> None:
    """Add `micros` to the daily cap of `key` (an agent or GLOBAL) for `day` alone: what
    approving a job that waits on that day's cap with a raise does (audited by the caller)."""
    await _ensure_day_row(conn, day, key)
    await conn.execute(
        update(spend_days)
        .where(spend_days.c.day == day, spend_days.c.agent == key)
        .values(raised_micros=spend_days.c.raised_micros + micros)
    )


async def _raised(conn: AsyncConnection, day: date, key: str) -> int:
    value = await conn.scalar(
        select(spend_days.c.raised_micros).where(spend_days.c.day == day, spend_days.c.agent == key)
    )
    return int(value or 0)


async def _used(conn: AsyncConnection, day: date, key: str) -> int:
    row = (
        await conn.execute(
            select(spend_days.c.reserved_micros + spend_days.c.spent_micros).where(
                spend_days.c.day == day, spend_days.c.agent == key
            )
        )
    ).first()
    return int(row[0]) if row is not None else 0
