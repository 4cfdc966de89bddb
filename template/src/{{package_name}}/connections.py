"""How the service reaches Redis, and what it says when Redis fails (template-owned:
copier-agent-worker).

Every connection (the worker's lanes, the CLI, recovery, `submit()`, `doctor`) takes its
settings from `redis_settings`, so `rediss://` always verifies the server's certificate and
host name and the TLS mode's rules apply everywhere. Redis' and OpenSSL's errors become one
line an operator can act on (`describe_redis_error`, `refusal`), naming the certificate or
memory problem rather than redis-py's generic "Error 1 connecting".
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import structlog
from arq.connections import ArqRedis, RedisSettings
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from .settings import Settings, SettingsError, check_redis_tls, redact_url

log = structlog.get_logger("redis")

# What a Redis in cluster mode is told, after "Redis at <url>".
CLUSTER_MODE = (
    "runs in cluster mode, which this service cannot use (arq's scripts reach keys in many "
    "hash slots): point REDIS_URL at a Redis with cluster mode disabled (one primary, with "
    "replicas for failover)"
)


class RedisClusterMode(RedisError):
    """The server is a Redis Cluster node: answering, but not a Redis this service can use.
    Its queue's scripts would fail once a job had run, and arq would deliver the job again
    and again."""


def redis_settings(settings: Settings, *, conn_retries: int = 5) -> RedisSettings:
    """arq connection settings for `REDIS_URL`, refused when they break the TLS mode.

    Built field by field because arq's `from_dsn` takes no CA and leaves host-name checking
    off: here `rediss://` always verifies the server certificate (against `REDIS_CA_CERT`,
    else the system's CA store) and that it names the URL's host, and presents
    `REDIS_CLIENT_CERT` / `REDIS_CLIENT_KEY` when they are set (mtls). The worker, the CLI,
    recovery and `submit()` all connect through this function.
    """
    check_redis_tls(settings)
    url = urlsplit(settings.redis_url)
    if url.scheme == "unix":
        return _unix_socket_settings(settings, conn_retries)
    try:
        port = url.port or 6379
        database = int(url.path.strip("/") or 0)
    except ValueError:
        raise SettingsError(
            f"REDIS_URL {redact_url(settings.redis_url)} has a malformed port or database "
            "number; write e.g. rediss://:PASSWORD@host:6379/0"
        ) from None
    tls = url.scheme == "rediss"
    return RedactedRedisSettings(
        host=url.hostname or "127.0.0.1",
        port=port,
        database=database,
        username=unquote(url.username) if url.username else None,
        password=unquote(url.password) if url.password else None,
        ssl=tls,
        ssl_cert_reqs="required",
        ssl_check_hostname=tls,
        ssl_ca_certs=_tls_file(settings.redis_ca_cert, tls),
        ssl_certfile=_tls_file(settings.redis_client_cert, tls),
        ssl_keyfile=_tls_file(settings.redis_client_key, tls),
        conn_timeout=2,
        conn_retries=conn_retries,
        conn_retry_delay=1,
    )


def _unix_socket_settings(settings: Settings, conn_retries: int) -> RedisSettings:
    """`unix:///path/to/redis.sock?db=N`, as redis-py and arq write it: a Redis on this host
    reached through its socket file, the password in the user part or as `password=`.

    >>> redis = _unix_socket_settings(Settings(redis_url="unix:///run/redis.sock?db=2"), 5)
    >>> redis.unix_socket_path, redis.database, redis.password
    ('/run/redis.sock', 2, None)
    >>> [_unix_socket_settings(Settings(redis_url=url), 5).password for url in (
    ...     "unix://:p%40ss@/run/redis.sock", "unix:///run/redis.sock?password=s3cret")]
    ['p@ss', 's3cret']
    >>> try:  # doctest: +NORMALIZE_WHITESPACE
    ...     _unix_socket_settings(Settings(redis_url="unix://cache:6379/0"), 5)
    ... except SettingsError as exc:
    ...     print(exc)
    REDIS_URL unix://cache:6379/0 is not a socket file and database;
    write e.g. unix:///run/redis/redis.sock?db=0
    """
    url = urlsplit(settings.redis_url)
    query = dict(parse_qsl(url.query))
    try:
        database = int(query.get("db", 0))
    except ValueError:
        database = -1
    if not url.path or url.netloc.rpartition("@")[2] or database < 0:
        raise SettingsError(
            f"REDIS_URL {redact_url(settings.redis_url)} is not a socket file and database; "
            "write e.g. unix:///run/redis/redis.sock?db=0"
        )
    password = unquote(url.password) if url.password else query.get("password")
    return RedactedRedisSettings(
        unix_socket_path=url.path,
        database=database,
        username=unquote(url.username) if url.username else None,
        password=password or None,
        conn_timeout=2,
        conn_retries=conn_retries,
        conn_retry_delay=1,
    )


async def open_pool(redis: RedisSettings, **arq_options: Any) -> ArqRedis:
    """arq's `create_pool` for `redis`, except that a pool whose first ping fails or is
    cancelled is closed here, never left to the garbage collector.

    arq drops such a pool with its connection open: a lane drained, or a check timed out,
    while its pool was still connecting left a socket to Redis open until a collection
    found it. `arq_options` are `create_pool`'s (`job_serializer`, `default_queue_name`, ...).
    A refused or dropped connection is tried again `redis.conn_retries` times, as arq does;
    a server in cluster mode is refused at once (RedisClusterMode).
    """
    retries_left = redis.conn_retries
    while True:
        pool = ArqRedis(
            host=redis.host,
            port=redis.port,
            unix_socket_path=redis.unix_socket_path,
            db=redis.database,
            username=redis.username,
            password=redis.password,
            socket_connect_timeout=redis.conn_timeout,
            ssl=redis.ssl,
            ssl_keyfile=redis.ssl_keyfile,
            ssl_certfile=redis.ssl_certfile,
            ssl_cert_reqs=redis.ssl_cert_reqs,
            ssl_ca_certs=redis.ssl_ca_certs,
            ssl_check_hostname=redis.ssl_check_hostname,
            retry=redis.retry,
            retry_on_timeout=redis.retry_on_timeout,
            retry_on_error=redis.retry_on_error,
            max_connections=redis.max_connections,
            encoding="utf8",
            **arq_options,
        )
        try:
            await pool.ping()
            await refuse_cluster(pool)
        except BaseException as exc:
            await pool.aclose()
            if isinstance(exc, ResponseError) and "cluster mode" in str(exc):
                # "SELECT is not allowed in cluster mode": a URL naming a database other than 0
                raise RedisClusterMode(CLUSTER_MODE) from exc
            if (
                retries_left == 0
                or isinstance(exc, RedisClusterMode)
                or not isinstance(exc, RedisError | OSError | TimeoutError)
            ):
                raise
            where: dict[str, Any] = (
                {"socket": redis.unix_socket_path}
                if redis.unix_socket_path
                else {"host": redis.host, "port": redis.port}
            )
            log.warning(
                "redis_connect_failed",
                **where,
                error=f"{type(exc).__name__}: {describe_redis_error(exc)}",
                retries_left=retries_left,
            )
        else:
            return pool
        retries_left -= 1
        await asyncio.sleep(redis.conn_retry_delay)


async def refuse_cluster(pool: ArqRedis) -> None:
    """Raise RedisClusterMode when `pool`'s server is a cluster node. CLUSTER INFO answers
    only there: a server without cluster support refuses it, and so may an ACL or a proxy,
    which this check lets pass (one round trip, once a pool)."""
    try:
        await pool.cluster("INFO")
    except ResponseError:
        return
    raise RedisClusterMode(CLUSTER_MODE)


def _tls_file(path: Path | None, tls: bool) -> str | None:
    return str(path) if tls and path is not None else None


class RedactedRedisSettings(RedisSettings):
    """arq's RedisSettings whose repr masks the password (arq's own repr prints it)."""

    def __repr__(self) -> str:
        shown = {**self.__dict__, "password": "***" if self.password else None}
        return "RedisSettings({})".format(", ".join(f"{k}={v!r}" for k, v in shown.items()))


def describe_redis_error(exc: BaseException, settings: Settings | None = None) -> str:
    """One line saying why a Redis connection failed, naming the TLS problem when there is one.

    redis-py wraps TLS failures in a generic "Error 1 connecting to host:port" message;
    the certificate check's own words ("Hostname mismatch, ...", "unable to get local issuer
    certificate") are what an operator needs. A server that requires client certificates
    answers a client without one with an alert or, under TLS 1.3, may just drop the
    connection after the handshake: such a drop on a `rediss://` connection without a client
    certificate says so.

    >>> describe_redis_error(ConnectionError("Connection refused\\nmore"))
    'Connection refused'
    """
    cause: BaseException | None = exc
    dropped = False
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            reason = (cause.verify_message or cause.reason or "").rstrip(".")
            return f"TLS certificate verify failed: {reason} ({_verify_hint(cause, settings)})"
        if isinstance(cause, ssl.SSLError):
            reason = str(cause.reason or cause)
            if "CERTIFICATE_REQUIRED" in reason:
                return (
                    f"TLS handshake failed: {reason} (the server requires a client certificate; "
                    "set REDIS_CLIENT_CERT and REDIS_CLIENT_KEY)"
                )
            return f"TLS handshake failed: {reason}"
        dropped = dropped or isinstance(cause, ConnectionResetError | BrokenPipeError)
        cause = cause.__cause__ or cause.__context__
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else type(exc).__name__
    if (
        dropped
        and settings is not None
        and urlsplit(settings.redis_url).scheme == "rediss"
        and settings.redis_client_cert is None
    ):
        message += (
            " (the TLS server dropped the connection: it may require a client certificate; "
            "set REDIS_CLIENT_CERT and REDIS_CLIENT_KEY)"
        )
    return message


def _verify_hint(error: ssl.SSLCertVerificationError, settings: Settings | None) -> str:
    if error.verify_code == _HOSTNAME_MISMATCH:
        return "the server certificate does not name the host in REDIS_URL"
    if settings is not None and settings.redis_ca_cert is None:
        return "no CA in the system store signed it; set REDIS_CA_CERT to the CA file"
    where = f"={settings.redis_ca_cert}" if settings is not None else ""
    return f"the server certificate is not signed by the CA in REDIS_CA_CERT{where}"


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH.
_HOSTNAME_MISMATCH = 62


def refusal(exc: BaseException) -> str:
    """Why Redis refused a write, in words an operator can act on."""
    if isinstance(exc, OutOfMemoryError):
        return (
            "Redis is out of memory (used memory is over its maxmemory, and with "
            "maxmemory-policy noeviction it refuses new jobs rather than drop queued ones); "
            "free memory or raise maxmemory"
        )
    return describe_redis_error(exc)
