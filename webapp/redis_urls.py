"""One Redis URL, two spellings: Celery's (kombu) and redis-py's.

The embedded server started by the demo listens on a Unix socket. Kombu spells that
``redis+socket:///path/redis.sock``; redis-py spells it ``unix:///path/redis.sock``.
Operators set one ``REDIS_URL`` in either spelling and each client gets the one it reads.
"""


def for_celery(url: str) -> str:
    """The URL as kombu expects it."""
    if url.startswith("unix://"):
        return "redis+socket://" + url[len("unix://") :]
    return url


def for_redis_py(url: str) -> str:
    """The URL as ``redis.Redis.from_url`` expects it."""
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://") :]
    return url
