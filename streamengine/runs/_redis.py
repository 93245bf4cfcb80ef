"""The run log in Redis: a hash and a stream per run, written only by Lua scripts.

Keys per run (one hash tag, so a cluster keeps them in one slot)::

    {prefix}{<run_id>}            hash: owner meta state token first last size lease_ms retain_ms lease_until stop
                                  read_at cp_seq cp_data (the run's checkpoint)
    {prefix}{<run_id>}:events     stream: entry id "<seq>-0", fields n (name), d (data), t (terminal)
    {prefix}{<run_id>}:approvals  hash: call_id -> {"approved", "reason"}

Each write is one script, so checking the lease token, adding the entries,
trimming and moving the counters happen atomically; the clock is the
server's (``TIME``).  Keys expire by ``PEXPIRE``: lease + retention while
running, the retention after the terminal entry.  A reader blocks in
``XREAD BLOCK`` on a second connection pool whose socket timeout exceeds
the longest block.  redis-py is imported when a log is made.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

from .. import _validation as validation
from .._errors import ConfigError
from .._logs import Redactor, redact_url
from ._contract import (
    LOST,
    MAX_READ_WAIT_S,
    RUNNING,
    Appended,
    ApprovalAnswer,
    Event,
    Frame,
    Lease,
    RunExistsError,
    RunFencedError,
    RunLog,
    RunLogError,
    RunNotFound,
    RunStatus,
    SavedCheckpoint,
    parse_meta,
    too_many_approvals,
)
from ._group_commit import GroupCommit

# Helpers every write script starts with.  KEYS = {hash, events, approvals} of one run; the *_of / *_to
# forms take a run's keys, for the script that writes several runs.
_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function expire_keys(from, to, ms)
  for i = from, to do redis.call('PEXPIRE', KEYS[i], ms) end
end
local function expire_all(ms) expire_keys(1, #KEYS, ms) end
-- Drop the oldest entries of `stream` until the run is within max_events and max_bytes; the newest always stays.
local function trim_stream(stream, first, last, size, max_events, max_bytes)
  local was, count = first, last - first + 1
  while first < last and (count > max_events or size > max_bytes) do
    local batch = redis.call('XRANGE', stream, first .. '-0', '+', 'COUNT', 64)
    if #batch == 0 then break end
    for _, entry in ipairs(batch) do
      local seq = tonumber(string.match(entry[1], '^(%d+)'))
      if seq >= last or (count <= max_events and size <= max_bytes) then break end
      size = size - #entry[2][2] - #entry[2][4]
      count = count - 1
      first = seq + 1
    end
  end
  if first ~= was then redis.call('XTRIM', stream, 'MINID', first .. '-0') end
  return first, size
end
local function trim(first, last, size, max_events, max_bytes)
  return trim_stream(KEYS[2], first, last, size, max_events, max_bytes)
end
-- Add ARGV[from..to] to `stream` as (name, data) pairs; the last one is terminal when `final`.
local function push_to(stream, from, to, first, last, size, final, max_events, max_bytes)
  for i = from, to, 2 do
    last = last + 1
    if final and i + 1 == to then
      redis.call('XADD', stream, last .. '-0', 'n', ARGV[i], 'd', ARGV[i + 1], 't', '1')
    else
      redis.call('XADD', stream, last .. '-0', 'n', ARGV[i], 'd', ARGV[i + 1])
    end
    size = size + #ARGV[i] + #ARGV[i + 1]
  end
  first, size = trim_stream(stream, first, last, size, max_events, max_bytes)
  return first, last, size
end
local function push(first, last, size, from, final, max_events, max_bytes)
  return push_to(KEYS[2], from, #ARGV, first, last, size, final, max_events, max_bytes)
end
local FIELDS = {'token', 'state', 'first', 'last', 'size', 'lease_ms', 'retain_ms', 'lease_until', 'stop'}
local function header_of(hash)
  local h = redis.call('HMGET', hash, unpack(FIELDS))
  if not h[1] then return nil end
  return {token = h[1], state = h[2], first = tonumber(h[3]), last = tonumber(h[4]), size = tonumber(h[5]),
          lease_ms = tonumber(h[6]), retain_ms = tonumber(h[7]), lease_until = tonumber(h[8]),
          stop = tonumber(h[9])}
end
local function header() return header_of(KEYS[1]) end
"""
# ARGV: owner meta token lease_ms retain_ms.  1 made, 0 the id is taken.
_CREATE = _PRELUDE + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
local lease_until = now_ms() + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'meta', ARGV[2], 'state', 'running', 'token', ARGV[3],
           'first', 1, 'last', 0, 'size', 0, 'lease_ms', ARGV[4], 'retain_ms', ARGV[5],
           'lease_until', lease_until, 'stop', 0)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) + tonumber(ARGV[5]))
return 1
"""
# ARGV: token max_events max_bytes final_state ('' to stay running) name data ...  {last seq, stop flag}, or
# {-1} fenced.
_APPEND = _PRELUDE + """
local h = header()
if not h or h.token ~= ARGV[1] or h.state ~= 'running' then return {-1} end
local final = ARGV[4] ~= ''
local first, last, size = push(h.first, h.last, h.size, 5, final, tonumber(ARGV[2]), tonumber(ARGV[3]))
if final then
  redis.call('HSET', KEYS[1], 'state', ARGV[4], 'first', first, 'last', last, 'size', size)
  expire_all(h.retain_ms)
else
  redis.call('HSET', KEYS[1], 'first', first, 'last', last, 'size', size, 'lease_until', now_ms() + h.lease_ms)
  expire_all(h.lease_ms + h.retain_ms)
end
return {last, h.stop or 0}
"""
# The appends of several runs in one call (_group_commit).  KEYS: hash, events, approvals of each run in turn.
# ARGV: max_events max_bytes, then per run: token, event count, name data ...  Per run two numbers: its last seq
# and stop flag, or -1 0 when its lease is stale (fenced: nothing written for that run).
_APPEND_MANY = _PRELUDE + """
local max_events, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, out, at = now_ms(), {}, 3
for k = 1, #KEYS, 3 do
  local token, to = ARGV[at], at + 1 + 2 * tonumber(ARGV[at + 1])
  local h = header_of(KEYS[k])
  if not h or h.token ~= token or h.state ~= 'running' then
    out[#out + 1] = -1
    out[#out + 1] = 0
  else
    local first, last, size = push_to(KEYS[k + 1], at + 2, to, h.first, h.last, h.size, false, max_events, max_bytes)
    redis.call('HSET', KEYS[k], 'first', first, 'last', last, 'size', size, 'lease_until', now + h.lease_ms)
    expire_keys(k, k + 2, h.lease_ms + h.retain_ms)
    out[#out + 1] = last
    out[#out + 1] = h.stop or 0
  end
  at = to + 1
end
return out
"""
# ARGV: token.  1 renewed, -1 fenced.
_RENEW = _PRELUDE + """
local h = header()
if not h or h.token ~= ARGV[1] or h.state ~= 'running' then return -1 end
redis.call('HSET', KEYS[1], 'lease_until', now_ms() + h.lease_ms)
expire_all(h.lease_ms + h.retain_ms)
return 1
"""
# ARGV: max_events max_bytes lost_state name data.  1 closed, 0 not due (ended, or its lease holds), -1 no run.
_CLOSE_LOST = _PRELUDE + """
local h = header()
if not h then return -1 end
if h.state ~= 'running' or now_ms() < h.lease_until then return 0 end
local first, last, size = push(h.first, h.last, h.size, 4, true, tonumber(ARGV[1]), tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'first', first, 'last', last, 'size', size)
expire_all(h.retain_ms)
return 1
"""
# ARGV: token.  {1, lease_ms, retain_ms} taken over, {0} not due (ended, or its lease holds), {-1} no run.
_TAKE_OVER = _PRELUDE + """
local h = header()
if not h then return {-1} end
local now = now_ms()
if h.state ~= 'running' or now < h.lease_until then return {0} end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'lease_until', now + h.lease_ms)
expire_all(h.lease_ms + h.retain_ms)
return {1, h.lease_ms, h.retain_ms}
"""
# ARGV: owner.  {state, first, last, stop, meta, lease expired 0/1, ms since read or -1}, or nil for no such
# run of this owner.
_STATUS = _PRELUDE + """
local h = redis.call('HMGET', KEYS[1], 'owner', 'state', 'first', 'last', 'stop', 'meta', 'lease_until', 'read_at')
if h[1] ~= ARGV[1] then return nil end
local now = now_ms()
local expired = (h[2] == 'running' and now >= tonumber(h[7])) and 1 or 0
local read_ago = h[8] and math.max(0, now - tonumber(h[8])) or -1
return {h[2], h[3], h[4], h[5], h[6], expired, read_ago}
"""
# ARGV: owner.  1 marked, 0 no such run of this owner.
_MARK_READ = _PRELUDE + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'read_at', now_ms())
return 1
"""
# ARGV: owner.  1 set, 0 no such run of this owner.
_REQUEST_STOP = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'stop', 1)
return 1
"""
# ARGV: owner call_id answer_json max.  {1, stored answer}, {0} no such run, {2} too many answers.
_ANSWER = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return {0} end
local stored = redis.call('HGET', KEYS[3], ARGV[2])
if stored then return {1, stored} end
if redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[4]) then return {2} end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], redis.call('PTTL', KEYS[1]))
return {1, ARGV[3]}
"""
# ARGV: token after_seq data ('' clears).  1 saved, -1 fenced.  In the run's hash: it expires with the run.
_SAVE_CHECKPOINT = """
local h = redis.call('HMGET', KEYS[1], 'token', 'state')
if h[1] ~= ARGV[1] or h[2] ~= 'running' then return -1 end
redis.call('HSET', KEYS[1], 'cp_seq', ARGV[2], 'cp_data', ARGV[3])
return 1
"""


#: How long an append waits for others to join its round trip, while appends keep coming (bench section 16).
GROUP_DELAY_S = 0.004
GROUP_BUSY_S = 0.05


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as exc:
        raise ConfigError(f"RedisRunLog needs redis-py ({exc}); install it with: pip install 'streamengine[redis]'"
                          ) from exc
    return redis


def _millis(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisRunLog(RunLog):
    """A :class:`RunLog` in Redis (Streams): the shared log for workers on several hosts.

    ``url`` is a redis-py URL (``redis://[:password@]host:port/db``,
    ``rediss://`` for TLS).  Every command waits at most ``timeout_s``
    (connect and reply), a blocking read at most its own timeout plus that.
    ``prefix`` starts every key, so several apps can share a database.
    Appends of this process's runs share round trips: while the server is
    busy, an append waits up to ``group_delay_s`` for others to join it
    (``_group_commit``; 0 writes each at once).
    """

    def __init__(self, url: str, *, prefix: str = "streamengine:run:", timeout_s: float = 5.0,
                 group_delay_s: float = GROUP_DELAY_S, **limits: Any) -> None:
        super().__init__(**limits)
        redis = _import_redis()
        self._errors = redis.exceptions.RedisError
        self._unreachable = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self.safe_url = redact_url(validation.name(url, "url (redis://host:port/db)"))
        self._redact = Redactor([urlsplit(url).password])
        self.prefix = validation.name(prefix, "prefix")
        timeout_s = validation.seconds(timeout_s, "timeout_s")
        options = {"decode_responses": True, "socket_connect_timeout": timeout_s, "health_check_interval": 30}
        try:
            self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, **options)
            self._blocking = redis.Redis.from_url(url, socket_timeout=MAX_READ_WAIT_S + timeout_s, **options)
        except ValueError as exc:
            raise ConfigError(f"not a Redis URL: {self.safe_url} ({self._redact(str(exc))}); "
                              "write redis://host:port/db") from exc
        self._scripts = {name: self._redis.register_script(lua) for name, lua in (
            ("create", _CREATE), ("append", _APPEND), ("renew", _RENEW), ("close_lost", _CLOSE_LOST),
            ("take_over", _TAKE_OVER), ("status", _STATUS), ("request_stop", _REQUEST_STOP), ("answer", _ANSWER),
            ("mark_read", _MARK_READ), ("save_checkpoint", _SAVE_CHECKPOINT))}
        self._scripts["append_many"] = self._redis.register_script(_APPEND_MANY)
        self._appends: GroupCommit[Tuple[Lease, List[Event]], Appended] = GroupCommit(
            self._append_all, delay_s=validation.seconds(group_delay_s, "group_delay_s", allow_zero=True),
            busy_s=GROUP_BUSY_S, wait_s=2 * timeout_s + 1)
        self._call("reach the server", self._redis.ping)

    def close(self) -> None:
        self._redis.close()
        self._blocking.close()

    def _keys(self, run_id: str) -> List[str]:
        run = f"{self.prefix}{{{run_id}}}"
        return [run, f"{run}:events", f"{run}:approvals"]

    def _call(self, doing: str, command: Any, *args: Any, **kwargs: Any) -> Any:
        """One command or script; redis-py's errors become RunLogError naming the server, not its password."""
        try:
            return command(*args, **kwargs)
        except self._errors as exc:
            raise self._error(doing, exc) from exc

    def _error(self, doing: str, exc: BaseException) -> RunLogError:
        hint = "; is the server up?" if isinstance(exc, self._unreachable) else ""
        error = RunLogError(f"the Redis run log at {self.safe_url} could not {doing} "
                            f"({type(exc).__name__}: {self._redact(str(exc))}){hint}")
        error.__cause__ = exc
        return error

    def _script(self, name: str, run_id: str, args: Sequence[Any], doing: str) -> Any:
        return self._call(doing, self._scripts[name], keys=self._keys(run_id), args=list(args))

    def _append_args(self, lease: Lease, events: Sequence[Event], final_state: str) -> List[Any]:
        return [lease.token, self.limits.max_events, self.limits.max_bytes, final_state, *_flat(events)]

    def _write(self, lease: Lease, events: Sequence[Event], final_state: str, doing: str) -> int:
        reply = self._script("append", lease.run_id, self._append_args(lease, events, final_state), doing)
        if int(reply[0]) < 0:
            raise RunFencedError(lease.run_id, doing)
        return int(reply[0])

    def _append_all(self, requests: List[Tuple[Lease, List[Event]]]) -> List[Union[Appended, BaseException]]:
        """Every grouped append in one round trip: one script call writes them all, each fenced by its own lease."""
        keys: List[str] = []
        args: List[Any] = [self.limits.max_events, self.limits.max_bytes]
        for lease, events in requests:
            keys += self._keys(lease.run_id)
            args += [lease.token, len(events), *_flat(events)]
        try:
            reply = self._scripts["append_many"](keys=keys, args=args)
        except self._errors as exc:
            return [self._error("append to", exc) for _ in requests]
        return [RunFencedError(lease.run_id, "append to") if reply[2 * index] < 0 else
                Appended(reply[2 * index], reply[2 * index + 1] == 1) for index, (lease, _) in enumerate(requests)]

    def _leased(self, lease: Lease, doing: str, *extra: Tuple[str, str]) -> List[Any]:
        """The run's stop flag, then each extra (HGET key field) in one round trip; fenced."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hmget(self._keys(lease.run_id)[0], "token", "state", "stop")
        for key, field in extra:
            pipe.hget(key, field)
        (token, state, stop), *rest = self._call(doing, pipe.execute)
        if token != lease.token or state != RUNNING:
            raise RunFencedError(lease.run_id, doing)
        return [stop == "1", *rest]

    # -- RunLog --------------------------------------------------------------------------

    def _do_create(self, lease: Lease, owner: str, meta_json: str) -> None:
        args = [owner, meta_json, lease.token, _millis(lease.lease_s), _millis(lease.retain_s)]
        if not self._script("create", lease.run_id, args, "create a run"):
            raise RunExistsError(f"run {lease.run_id!r} already exists; make a fresh id with new_run_id()")

    def _do_append(self, lease: Lease, events: List[Event]) -> Appended:
        try:
            return self._appends.submit((lease, events))
        except TimeoutError as exc:
            raise RunLogError(f"the Redis run log at {self.safe_url} could not append to run {lease.run_id!r} "
                              f"({exc}); is the server up?") from exc

    def _do_renew(self, lease: Lease) -> None:
        if int(self._script("renew", lease.run_id, [lease.token], "renew the lease of")) < 0:
            raise RunFencedError(lease.run_id, "renew the lease of")

    def _do_finish(self, lease: Lease, terminal: Event, state: str) -> int:
        return self._write(lease, [terminal], state, "finish")

    def _do_stop_requested(self, lease: Lease) -> bool:
        return bool(self._leased(lease, "poll the stop flag of")[0])

    def _do_approval_answer(self, lease: Lease, call_id: str) -> Optional[ApprovalAnswer]:
        stored = self._leased(lease, "read an approval of", (self._keys(lease.run_id)[2], call_id))[1]
        return None if stored is None else _answer(call_id, stored)

    def _do_read(self, run_id: str, owner: str, after_seq: int, timeout_s: float, limit: int) -> List[Frame]:
        keys = self._keys(run_id)
        found = self._call("read a run", self._redis.hmget, keys[0], "owner", "state", "last")
        if found[0] != owner:
            raise RunNotFound(run_id)
        if int(found[2]) > after_seq:
            entries = self._call("read a run", self._redis.xrange, keys[1], f"{after_seq + 1}-0", "+", count=limit)
            return _frames(entries)
        if found[1] != RUNNING or timeout_s <= 0:
            return []
        streams = self._call("wait for a run's events", self._blocking.xread, {keys[1]: f"{after_seq}-0"},
                             count=limit, block=_millis(timeout_s))
        return _frames(streams[0][1]) if streams else []

    def _do_status(self, run_id: str, owner: str) -> RunStatus:
        found = self._script("status", run_id, [owner], "read a run's status")
        if found is None:
            raise RunNotFound(run_id)
        state, first, last, stop, meta, expired, read_ago = found
        terminal = None
        if state != RUNNING:
            entries = self._call("read a run's status", self._redis.xrevrange, self._keys(run_id)[1], count=1)
            terminal = _frames(entries)[0] if entries else None
        return RunStatus(run_id, state, int(first), int(last), parse_meta(meta), bool(expired), stop == "1",
                         terminal, None if int(read_ago) < 0 else int(read_ago) / 1000)

    def _do_close_lost(self, run_id: str, event: Event) -> bool:
        args = [self.limits.max_events, self.limits.max_bytes, LOST, *event]
        closed = int(self._script("close_lost", run_id, args, "close a lost run"))
        if closed < 0:
            raise RunNotFound(run_id)
        return closed == 1

    def _do_take_over(self, run_id: str, token: str) -> Optional[Lease]:
        found = self._script("take_over", run_id, [token], "take over a run")
        if found[0] < 0:
            raise RunNotFound(run_id)
        return Lease(run_id, token, found[1] / 1000, found[2] / 1000) if found[0] == 1 else None

    def _do_request_stop(self, run_id: str, owner: str) -> None:
        if not self._script("request_stop", run_id, [owner], "set the stop flag"):
            raise RunNotFound(run_id)

    def _do_mark_read(self, run_id: str, owner: str) -> None:
        if not self._script("mark_read", run_id, [owner], "mark a run read"):
            raise RunNotFound(run_id)

    def _do_answer_approval(self, run_id: str, owner: str, answer: ApprovalAnswer) -> ApprovalAnswer:
        stored = json.dumps({"approved": answer.approved, "reason": answer.reason})
        args = [owner, answer.call_id, stored, self.limits.max_approvals]
        found = self._script("answer", run_id, args, "store an approval")
        if found[0] == 0:
            raise RunNotFound(run_id)
        if found[0] == 2:
            raise RunLogError(too_many_approvals(run_id, self.limits.max_approvals))
        return _answer(answer.call_id, found[1])

    def _do_save_checkpoint(self, lease: Lease, after_seq: int, data: str) -> bool:
        args = [lease.token, after_seq, data]
        if int(self._script("save_checkpoint", lease.run_id, args, "save a checkpoint of")) < 0:
            raise RunFencedError(lease.run_id, "save a checkpoint of")
        return True

    def _do_checkpoint(self, run_id: str) -> Optional[SavedCheckpoint]:
        seq, data = self._call("read a checkpoint", self._redis.hmget, self._keys(run_id)[0], "cp_seq", "cp_data")
        return None if seq is None or data is None else SavedCheckpoint(int(seq), data)


def _flat(events: Sequence[Event]) -> List[str]:
    """``[(name, data), ...]`` as the scripts take them: name, data, name, data ..."""
    return [part for event in events for part in event]


def _frames(entries: Sequence[Tuple[str, Dict[str, str]]]) -> List[Frame]:
    return [Frame(int(entry_id.partition("-")[0]), fields["n"], fields["d"], "t" in fields)
            for entry_id, fields in entries]


def _answer(call_id: str, stored: str) -> ApprovalAnswer:
    answer = json.loads(stored)
    return ApprovalAnswer(call_id, bool(answer["approved"]), str(answer["reason"]))
