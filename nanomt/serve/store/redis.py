"""The store on a Redis server (redis://HOST:PORT/DB): shared by every replica of a fleet. Each operation is one
round trip, a script where it must be atomic; the scripts read Redis's clock, so that replicas' clocks need not
agree."""

from __future__ import annotations

import math
import uuid

from nanomt.serve.store.base import Hit, Store, StoreDown, StoreError, redacted

# The sliding window in one step (at the time ARGV[5] where a test gives one).
HIT_SCRIPT = """
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1e6
end
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local n = redis.call('ZCARD', KEYS[1])
if n < limit then
  if ARGV[4] == '1' then
    redis.call('ZADD', KEYS[1], now, ARGV[3])
    redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
  end
  return {1, '0'}
end
local oldest = redis.call('ZRANGE', KEYS[1], n - limit, n - limit, 'WITHSCORES')
return {0, tostring(tonumber(oldest[2]) + window - now)}
"""
# A value and its groups (KEYS[2..], each a sorted set by time added, ARGV[2 + i] its bound): past a bound the
# oldest members go with their values; members older than the ttl have expired and leave first, and a group
# expires with its newest member, so that a group per client never outlives its clients.
PUT_SCRIPT = """
local ttl = ARGV[2]
if ttl == '' then redis.call('SET', KEYS[1], ARGV[1]) else redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 2, #KEYS do
  local group = KEYS[i]
  if ttl ~= '' then redis.call('ZREMRANGEBYSCORE', group, '-inf', now - tonumber(ttl) / 1000) end
  redis.call('ZADD', group, now, KEYS[1])
  local extra = redis.call('ZCARD', group) - tonumber(ARGV[i + 1])
  if extra > 0 then
    local old = redis.call('ZRANGE', group, 0, extra - 1)
    redis.call('ZREMRANGEBYRANK', group, 0, extra - 1)
    for _, k in ipairs(old) do redis.call('DEL', k) end
  end
  if ttl ~= '' then redis.call('PEXPIRE', group, ttl) end
end
return 1
"""
DELETE_SCRIPT = """
local found = redis.call('DEL', KEYS[1])
for i = 2, #KEYS do redis.call('ZREM', KEYS[i], KEYS[1]) end
return found
"""


class RedisStore(Store):
    """A Redis server (see the module's docstring); `timeout` bounds each round trip, connecting included; `clock`
    (a test's) replaces Redis's clock in the counter."""

    def __init__(self, url: str, timeout: float = 2.0, clock=None):
        self._clock = clock
        try:
            import redis
        except ImportError:
            msg = f"{redacted(url)}: a Redis store needs the redis library: pip install 'nanomt[serve]'"
            raise StoreError(msg) from None
        self.url, self._redis = redacted(url), redis
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
            self._client.ping()
        except (redis.RedisError, ValueError, OSError) as e:
            raise StoreError(f"{self.url}: cannot reach the store ({e})") from None
        self._hit = self._client.register_script(HIT_SCRIPT)
        self._put = self._client.register_script(PUT_SCRIPT)
        self._delete = self._client.register_script(DELETE_SCRIPT)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (self._redis.RedisError, OSError) as e:
            raise StoreDown(f"{self.url}: {e}") from None

    def get(self, key):
        return self._call(self._client.get, key)

    def get_many(self, keys):
        return self._call(self._client.mget, keys) if keys else []

    def put(self, key, value, ttl=None, bounds=()):
        px = "" if ttl is None else str(max(1, int(ttl * 1000)))
        keys = [key, *(group for group, _ in bounds)]
        self._call(self._put, keys=keys, args=[bytes(value), px, *(most for _, most in bounds)])

    def delete(self, key, groups=()):
        return bool(self._call(self._delete, keys=[key, *groups]))

    def count(self, group):
        return self._call(self._client.zcard, group)

    def scan(self, prefix):
        keys = sorted(self._call(lambda: list(self._client.scan_iter(match=_glob_escape(prefix) + "*", count=1000))))
        values = self._call(self._client.mget, keys) if keys else []
        return [(k.decode(), v) for k, v in zip(keys, values) if v is not None]

    def hit(self, client, limit, window, count=True):
        now = "" if self._clock is None else repr(self._clock())
        args = [limit, window, uuid.uuid4().hex, int(count), now]
        allowed, wait = self._call(self._hit, keys=[client], args=args)
        return Hit(True) if allowed else Hit(False, max(1, math.ceil(float(wait))))

    def ping(self):
        self._call(self._client.ping)

    def close(self):
        self._client.close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
