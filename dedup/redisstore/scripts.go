package redisstore

import "github.com/redis/go-redis/v9"

// The scripts run atomically on the Redis server; every key they touch is a
// declared KEYS entry, and all keys of one scope share a hash slot (see
// keys), so they also run on Redis Cluster. Times come from the server's
// TIME. A record is a hash; its lease is a separate string key holding
// "<owner token>:<fence>", set with PX so Redis forgets a dead owner's lease
// by itself.

// claimScript decides one delivery.
//
// KEYS: 1 record (of the delivery's message ID, or of the message ID the
// business key points to), 2 business-key index (or the record key again
// when there is no business key), 3 lease, 4 dead-letter stream.
// ARGV: 1 message ID of the delivery, 2 business key ("" for none),
// 3 record key is the business key's record ("1") or the delivery's own
// ("0"), 4 fingerprints "keyid:hex" separated by spaces (current first),
// 5 owner token, 6 lease TTL ms, 7 record TTL ms while not final, 8 source,
// 9 reconsume times, 10 max attempts, 11 final-record TTL ms,
// 12 dead-letter retention ms (older entries are trimmed), then dead-letter
// fields 13 topic, 14 key, 15 payload, 16 headers JSON, 17 scope; 18 the
// message ID of the record when ARGV 3 is "1".
//
// Replies: {"BK", message ID} the business key belongs to another message's
// record (call again with that record); {"GONE"} that record vanished (call
// again as a new delivery); {"RUN", attempts, fence}; {"HELD", status,
// attempts, matched}; {"DUP", status, attempts, matched}; {"CONFLICT",
// status, attempts, matched, dead-letter ID}; {"EXHAUSTED", attempts,
// matched, dead-letter ID}.
var claimScript = redis.NewScript(`
local rec, bki, lease, dl = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mid, bk, viaBK = ARGV[1], ARGV[2], ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function deadletter(recmid, reason, err, attempts)
  return redis.call('XADD', dl, 'MINID', '~', string.format('%d', now - tonumber(ARGV[12])), '*',
    'scope', ARGV[17], 'message_id', mid, 'business_key', bk, 'record', recmid, 'reason', reason,
    'error', err, 'error_class', reason, 'attempts', attempts, 'topic', ARGV[13], 'key', ARGV[14],
    'payload', ARGV[15], 'headers', ARGV[16], 'source', ARGV[8], 'created_ms', now)
end
local st = redis.call('HGET', rec, 'status')
if not st then
  if viaBK then
    -- The business key's record expired before its index: drop the index.
    if redis.call('GET', bki) == ARGV[18] then redis.call('DEL', bki) end
    return {'GONE'}
  end
  if bk ~= '' then
    local other = redis.call('GET', bki)
    if other and other ~= mid then return {'BK', other} end
  end
  local fp = string.match(ARGV[4], '^%S+')
  redis.call('HSET', rec, 'scope', ARGV[17], 'message_id', mid, 'business_key', bk, 'status', 'PROCESSING',
    'attempts', 1, 'fence', 1, 'owner', ARGV[5], 'fingerprint', fp, 'source', ARGV[8],
    'reconsume_times', ARGV[9], 'created_ms', now, 'updated_ms', now)
  redis.call('PEXPIRE', rec, ARGV[7])
  if bk ~= '' then redis.call('SET', bki, mid, 'PX', ARGV[7]) end
  redis.call('SET', lease, ARGV[5] .. ':1', 'PX', ARGV[6])
  return {'RUN', 1, 1}
end
local r = redis.call('HMGET', rec, 'attempts', 'fence', 'fingerprint', 'message_id')
local attempts, fence, fp, recmid = tonumber(r[1]), tonumber(r[2]), r[3], r[4]
local matched = 'message_id'
if recmid ~= mid then matched = 'business_key' end
local same = false
for s in string.gmatch(ARGV[4], '%S+') do
  if s == fp then same = true end
end
if not same then
  local id = deadletter(recmid, 'fingerprint_conflict',
    'idemq: same identity, different payload: matches record ' .. recmid .. ' by ' .. matched, attempts)
  return {'CONFLICT', st, attempts, matched, id}
end
if st == 'SUCCEEDED' or st == 'FAILED_FINAL' then
  return {'DUP', st, attempts, matched}
end
if st == 'PROCESSING' and redis.call('EXISTS', lease) == 1 then
  return {'HELD', st, attempts, matched}
end
-- FAILED_RETRYABLE, or PROCESSING whose owner's lease expired: take over.
if st == 'PROCESSING' and attempts >= tonumber(ARGV[10]) then
  -- The last allowed execution never reported back (its process died):
  -- final, so a message that kills its consumer cannot loop forever. (A
  -- FAILED_RETRYABLE record at the limit was re-driven: it runs again.)
  redis.call('HSET', rec, 'status', 'FAILED_FINAL', 'updated_ms', now,
    'last_error', 'idemq: attempts exhausted: the last execution never reported an outcome',
    'last_error_class', 'attempts_exhausted')
  redis.call('HDEL', rec, 'owner')
  redis.call('PEXPIRE', rec, ARGV[11])
  if bk ~= '' then redis.call('PEXPIRE', bki, ARGV[11]) end
  local id = deadletter(recmid, 'attempts_exhausted',
    'idemq: attempts exhausted: the last execution never reported an outcome', attempts)
  return {'EXHAUSTED', attempts, matched, id}
end
attempts = attempts + 1
fence = fence + 1
redis.call('HSET', rec, 'status', 'PROCESSING', 'attempts', attempts, 'fence', fence, 'owner', ARGV[5],
  'source', ARGV[8], 'reconsume_times', ARGV[9], 'updated_ms', now)
redis.call('PEXPIRE', rec, ARGV[7])
if bk ~= '' then redis.call('PEXPIRE', bki, ARGV[7]) end
redis.call('SET', lease, ARGV[5] .. ':' .. fence, 'PX', ARGV[6])
return {'RUN', attempts, fence}
`)

// renewScript extends a lease (the watchdog). KEYS: 1 record, 2 lease.
// ARGV: 1 owner token, 2 fence, 3 lease TTL ms. It returns 1 when the lease
// is this owner's (re-taken if it had lapsed and nobody took over), 0 when
// another owner holds the record (fenced).
var renewScript = redis.NewScript(`
local rec, lease = KEYS[1], KEYS[2]
local val = ARGV[1] .. ':' .. ARGV[2]
local r = redis.call('HMGET', rec, 'status', 'owner', 'fence')
if r[1] ~= 'PROCESSING' or r[2] ~= ARGV[1] or r[3] ~= ARGV[2] then return 0 end
local cur = redis.call('GET', lease)
if cur and cur ~= val then return 0 end
redis.call('SET', lease, val, 'PX', ARGV[3])
return 1
`)

// finishScript records the outcome of an execution if this owner still
// holds the record. KEYS: 1 record, 2 business-key index (or the record
// key), 3 lease, 4 dead-letter stream. ARGV: 1 owner token, 2 fence,
// 3 status (SUCCEEDED, FAILED_RETRYABLE, FAILED_FINAL, or RELEASE: give the
// lease back without counting the attempt), 4 record TTL ms, 5 error text,
// 6 error class, 7 dead-letter reason ("" for none), 8 dead-letter retention
// ms, then dead-letter fields 9 topic, 10 key, 11 payload, 12 headers JSON,
// 13 source, 14 scope, 15 message ID of the delivery, 16 business key.
// It returns {0} when fenced, else {1, dead-letter ID or ""}.
var finishScript = redis.NewScript(`
local rec, bki, lease, dl = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local r = redis.call('HMGET', rec, 'status', 'owner', 'fence', 'attempts', 'message_id')
if r[1] ~= 'PROCESSING' or r[2] ~= ARGV[1] or r[3] ~= ARGV[2] then return {0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = ARGV[3]
if st == 'RELEASE' then
  local a = tonumber(r[4]) - 1
  if a < 0 then a = 0 end
  redis.call('HSET', rec, 'status', 'FAILED_RETRYABLE', 'attempts', a, 'updated_ms', now)
else
  redis.call('HSET', rec, 'status', st, 'updated_ms', now)
  if ARGV[5] ~= '' then
    redis.call('HSET', rec, 'last_error', ARGV[5], 'last_error_class', ARGV[6])
  end
end
redis.call('HDEL', rec, 'owner')
redis.call('PEXPIRE', rec, ARGV[4])
if bki ~= rec then redis.call('PEXPIRE', bki, ARGV[4]) end
if redis.call('GET', lease) == ARGV[1] .. ':' .. ARGV[2] then redis.call('DEL', lease) end
local id = ''
if ARGV[7] ~= '' then
  id = redis.call('XADD', dl, 'MINID', '~', string.format('%d', now - tonumber(ARGV[8])), '*',
    'scope', ARGV[14], 'message_id', ARGV[15], 'business_key', ARGV[16], 'record', r[5], 'reason', ARGV[7],
    'error', ARGV[5], 'error_class', ARGV[6], 'attempts', r[4], 'topic', ARGV[9], 'key', ARGV[10],
    'payload', ARGV[11], 'headers', ARGV[12], 'source', ARGV[13], 'created_ms', now)
end
return {1, id}
`)

// rejectScript records bad input: a FAILED_FINAL record (unless one that
// ended already exists: then the copy is a duplicate) and a dead letter.
// KEYS: 1 record, 2 dead-letter stream. ARGV: 1 message ID, 2 business key,
// 3 final-record TTL ms, 4 error text, 5 error class, 6 reason, 7 dead-letter
// retention ms, 8 topic, 9 key, 10 payload, 11 headers JSON, 12 source, 13 scope,
// 14 reconsume times. Replies {"DUP", status, attempts}, {"HELD", status,
// attempts} (a lease-mode owner holds the record) or {"DEAD", attempts,
// dead-letter ID}.
var rejectScript = redis.NewScript(`
local rec, dl = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', rec, 'status', 'attempts')
if r[1] == 'SUCCEEDED' or r[1] == 'FAILED_FINAL' then return {'DUP', r[1], tonumber(r[2])} end
if r[1] == 'PROCESSING' then return {'HELD', r[1], tonumber(r[2])} end
local attempts = tonumber(r[2] or '0')
if not r[1] then
  redis.call('HSET', rec, 'scope', ARGV[13], 'message_id', ARGV[1], 'business_key', ARGV[2], 'attempts', 0,
    'fence', 0, 'fingerprint', '', 'created_ms', now)
end
redis.call('HSET', rec, 'status', 'FAILED_FINAL', 'last_error', ARGV[4], 'last_error_class', ARGV[5],
  'source', ARGV[12], 'reconsume_times', ARGV[14], 'updated_ms', now)
redis.call('PEXPIRE', rec, ARGV[3])
local id = redis.call('XADD', dl, 'MINID', '~', string.format('%d', now - tonumber(ARGV[7])), '*',
  'scope', ARGV[13], 'message_id', ARGV[1], 'business_key', ARGV[2], 'record', ARGV[1], 'reason', ARGV[6],
  'error', ARGV[4], 'error_class', ARGV[5], 'attempts', attempts, 'topic', ARGV[8], 'key', ARGV[9],
  'payload', ARGV[10], 'headers', ARGV[11], 'source', ARGV[12], 'created_ms', now)
return {'DEAD', attempts, id}
`)

// redriveScript makes a FAILED_FINAL record FAILED_RETRYABLE (attempts
// kept). KEYS: 1 record, 2 business-key index (or the record key). ARGV:
// 1 record TTL ms. Replies the record's status before ("" when there is no
// record).
var redriveScript = redis.NewScript(`
local rec, bki = KEYS[1], KEYS[2]
local st = redis.call('HGET', rec, 'status')
if not st then return '' end
if st ~= 'FAILED_FINAL' then return st end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', rec, 'status', 'FAILED_RETRYABLE', 'updated_ms', now, 'redriven_ms', now)
redis.call('PEXPIRE', rec, ARGV[1])
if bki ~= rec then redis.call('PEXPIRE', bki, ARGV[1]) end
return st
`)
