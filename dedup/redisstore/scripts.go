package redisstore

import "github.com/redis/go-redis/v9"

// The scripts run atomically on the Redis server; every key they touch is a
// declared KEYS entry, and all keys of one scope share a hash slot (see
// keys), so they also run on Redis Cluster. Times come from the server's
// TIME. A record is a hash; its lease is a separate string key holding
// "<owner token>:<fence>", set with PX so Redis forgets a dead owner's lease
// by itself. A business-key index is a string naming the message ID of the
// record that holds the business key.

// prelude is shared by the scripts: the server's time in ms, and index(),
// which points the business-key index KEYS[2] at record recmid for ttl ms
// unless it names another record (a stale or foreign index is left alone).
//
// Every script may run twice for one call: go-redis sends a command again
// when its connection died before the reply came (Options.MaxRetries, 3 by
// default), and the first run may well have happened. So each script
// recognises its caller and answers a second run exactly as it answered the
// first, writing nothing more. The caller is known by an ID the client makes
// fresh for each call, and the record keeps what a second run needs:
//
//   - claim (owner token): a PROCESSING record whose owner is the token is
//     this claim's ("RUN" again, with the same attempts and fence); a claim
//     that found the attempts used up keeps its token in closed_by and the
//     dead letter's ID in dead_letter ("EXHAUSTED" again); a conflict marker
//     holds "<owner token> <dead-letter ID>" ("CONFLICT" with that ID);
//   - completion, failure, release (owner token and fence): the record keeps
//     owner and fence after the lease ends, and dead_letter; a record no
//     longer PROCESSING under the same owner and fence was ended by this
//     call ({1, dead_letter} again);
//   - rejection (a fresh token): closed_by and dead_letter, as the claim;
//   - re-drive (a fresh token): redriven_by;
//   - renewal: nothing; it sets the same lease again.
//
// A takeover clears closed_by and dead_letter and sets a new owner, so the
// record remembers its last execution only: a second run that arrives
// after another owner has claimed the record again (a release or a
// retryable failure leaves it open to the next copy) answers "fenced" or
// "lease held": not acked, the broker redelivers, and the next copy finds
// the truth. go-redis resends within its retry backoff (8 ms to 512 ms by
// default), long before another copy can claim.
const prelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function index(recmid, ttl)
  if KEYS[2] == KEYS[1] then return end
  local cur = redis.call('GET', KEYS[2])
  if (not cur) or cur == recmid then redis.call('SET', KEYS[2], recmid, 'PX', ttl) end
end
`

// routing is shared by claimScript and rejectScript, whose KEYS[1..2] and
// ARGV[1..4] mean the same (record, business-key index; message ID,
// business key, "1" when the record was reached through the business key,
// that record's message ID). route() is called when the record does not
// exist and says where to look instead: {"GONE"} when the record the
// business key pointed to expired (its stale index is dropped: call again as
// a new delivery), {"BK", message ID} when the business key belongs to
// another message's record (call again on it), nil to go on with a new
// record.
const routing = `
local function route()
  if ARGV[3] == '1' then
    if redis.call('GET', KEYS[2]) == ARGV[4] then redis.call('DEL', KEYS[2]) end
    return {'GONE'}
  end
  if ARGV[2] ~= '' then
    local other = redis.call('GET', KEYS[2])
    if other and other ~= ARGV[1] then return {'BK', other} end
  end
  return nil
end
`

// claimScript decides one delivery.
//
// KEYS: 1 record (of the delivery's message ID, or of the message ID its
// business key points to), 2 business-key index (or the record key again
// when there is no business key), 3 lease, 4 dead-letter stream,
// 5 conflict marker (one dead letter per message ID and payload).
// ARGV: 1 message ID of the delivery, 2 business key ("" for none), 3 "1"
// when KEYS[1] is the record the business key pointed to, else "0", 4 that
// record's message ID, 5 owner token, 6 lease TTL ms, 7 TTL ms of a record
// that is not final, 8 source, 9 reconsume times, 10 max attempts, 11 TTL ms
// of a final record, 12 dead-letter retention ms, then dead-letter fields
// 13 topic, 14 key, 15 payload, 16 headers JSON, 17 scope; 18 the number of
// fingerprints n, 19… the payload's fingerprints "<key ID>:<hex>" under
// every configured key, current first.
//
// Replies: {"BK", message ID}: the business key belongs to another
// message's record (call again with that record); {"GONE"}: that record
// vanished and its index was dropped (call again as a new delivery);
// {"RUN", attempts, fence, record message ID, record business key};
// {"HELD"|"DUP", status, attempts, matched}; {"CONFLICT", status, attempts,
// matched, dead-letter ID or ""}; {"EXHAUSTED", attempts, matched,
// dead-letter ID}.
//
// A second run with the same owner token answers as the first: "RUN" with
// the same attempts and fence while the record is still this owner's
// PROCESSING (its lease set again if it lapsed meanwhile), "EXHAUSTED" with
// the same dead-letter ID, and "CONFLICT" with the same dead-letter ID.
var claimScript = redis.NewScript(prelude + routing + `
local rec, bki, lease, dl = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mid, bk, token = ARGV[1], ARGV[2], ARGV[5]
local nfp = tonumber(ARGV[18])
local function deadletter(recmid, reason, err, attempts)
  return redis.call('XADD', dl, 'MINID', '~', string.format('%d', now - tonumber(ARGV[12])), '*',
    'scope', ARGV[17], 'message_id', mid, 'business_key', bk, 'record', recmid, 'reason', reason,
    'error', err, 'error_class', reason, 'attempts', attempts, 'topic', ARGV[13], 'key', ARGV[14],
    'payload', ARGV[15], 'headers', ARGV[16], 'source', ARGV[8], 'created_ms', now)
end
local st = redis.call('HGET', rec, 'status')
if not st then
  local elsewhere = route()
  if elsewhere then return elsewhere end
  redis.call('HSET', rec, 'scope', ARGV[17], 'message_id', mid, 'business_key', bk, 'status', 'PROCESSING',
    'attempts', 1, 'fence', 1, 'owner', ARGV[5], 'fingerprint', ARGV[19], 'source', ARGV[8],
    'reconsume_times', ARGV[9], 'created_ms', now, 'updated_ms', now)
  redis.call('PEXPIRE', rec, ARGV[7])
  index(mid, ARGV[7])
  redis.call('SET', lease, ARGV[5] .. ':1', 'PX', ARGV[6])
  return {'RUN', 1, 1, mid, bk}
end
local r = redis.call('HMGET', rec, 'attempts', 'fence', 'fingerprint', 'message_id', 'business_key', 'owner', 'closed_by',
  'dead_letter')
local attempts, fence, fp, recmid, recbk = tonumber(r[1]), tonumber(r[2]), r[3], r[4], r[5] or ''
local matched = 'message_id'
if recmid ~= mid then matched = 'business_key' end
-- A second run of this claim (see prelude).
if st == 'PROCESSING' and r[6] == token then
  if not redis.call('GET', lease) then redis.call('SET', lease, token .. ':' .. fence, 'PX', ARGV[6]) end
  return {'RUN', attempts, fence, recmid, recbk}
end
if r[7] == token then return {'EXHAUSTED', attempts, matched, r[8] or ''} end
local same = false
for i = 1, nfp do
  if ARGV[18 + i] == fp then same = true end
end
if not same then
  local id = ''
  local mark = redis.call('GET', KEYS[5])
  if not mark then
    id = deadletter(recmid, 'fingerprint_conflict',
      'idemq: same identity, different payload: matches record ' .. recmid .. ' by ' .. matched, attempts)
    redis.call('SET', KEYS[5], token .. ' ' .. id, 'PX', ARGV[11])
  elseif string.sub(mark, 1, #token + 1) == token .. ' ' then
    id = string.sub(mark, #token + 2) -- a second run of the claim that wrote it
  end
  return {'CONFLICT', st, attempts, matched, id}
end
if st == 'SUCCEEDED' or st == 'FAILED_FINAL' then
  return {'DUP', st, attempts, matched}
end
if st == 'PROCESSING' and redis.call('EXISTS', lease) == 1 then
  return {'HELD', st, attempts, matched}
end
if bk ~= recbk then bk = '' end -- never move another business key's index
-- FAILED_RETRYABLE, or PROCESSING whose owner's lease expired: take over.
if st == 'PROCESSING' and attempts >= tonumber(ARGV[10]) then
  -- The last allowed execution never reported back (its process died):
  -- final, so a message that kills its consumer cannot loop forever. (A
  -- FAILED_RETRYABLE record at the limit was re-driven: it runs again.)
  local msg = 'idemq: attempts exhausted: the last execution never reported an outcome'
  local id = deadletter(recmid, 'attempts_exhausted', msg, attempts)
  redis.call('HSET', rec, 'status', 'FAILED_FINAL', 'updated_ms', now, 'last_error', msg,
    'last_error_class', 'attempts_exhausted', 'closed_by', token, 'dead_letter', id)
  redis.call('HDEL', rec, 'owner')
  redis.call('PEXPIRE', rec, ARGV[11])
  if bk ~= '' then index(recmid, ARGV[11]) end
  return {'EXHAUSTED', attempts, matched, id}
end
attempts = attempts + 1
fence = fence + 1
redis.call('HSET', rec, 'status', 'PROCESSING', 'attempts', attempts, 'fence', fence, 'owner', ARGV[5],
  'source', ARGV[8], 'reconsume_times', ARGV[9], 'updated_ms', now)
redis.call('HDEL', rec, 'closed_by', 'dead_letter')
redis.call('PEXPIRE', rec, ARGV[7])
if bk ~= '' then index(recmid, ARGV[7]) end
redis.call('SET', lease, ARGV[5] .. ':' .. fence, 'PX', ARGV[6])
return {'RUN', attempts, fence, recmid, recbk}
`)

// renewScript extends a lease (the watchdog). KEYS: 1 record, 2 lease.
// ARGV: 1 owner token, 2 fence, 3 lease TTL ms. It returns 1 when the lease
// is this owner's (re-taken if it had lapsed and nobody took over), 0 when
// the record is not this owner's any more (fenced). It is safe to run twice
// as it is: a second run finds the lease it set and sets it again.
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
// holds the record. KEYS: 1 record, 2 the record's business-key index (or
// the record key), 3 lease, 4 dead-letter stream. ARGV: 1 owner token,
// 2 fence, 3 status (SUCCEEDED, FAILED_RETRYABLE, FAILED_FINAL, or RELEASE:
// give the lease back without counting the attempt), 4 record TTL ms,
// 5 error text, 6 error class, 7 dead-letter reason ("" for none),
// 8 dead-letter retention ms, then dead-letter fields 9 topic, 10 key,
// 11 payload, 12 headers JSON, 13 source, 14 scope, 15 message ID of the
// delivery, 16 business key of the delivery. It returns {0} when fenced,
// else {1, dead-letter ID or ""}. The record keeps its owner and fence
// after this, so a second run by the same owner token and fence, finding
// the record no longer PROCESSING, returns the first run's reply.
var finishScript = redis.NewScript(prelude + `
local rec, lease, dl = KEYS[1], KEYS[3], KEYS[4]
local r = redis.call('HMGET', rec, 'status', 'owner', 'fence', 'attempts', 'message_id', 'dead_letter')
if r[2] ~= ARGV[1] or r[3] ~= ARGV[2] then return {0} end
if r[1] ~= 'PROCESSING' then return {1, r[6] or ''} end -- a second run (see prelude)
if ARGV[3] == 'RELEASE' then
  local a = tonumber(r[4]) - 1
  if a < 0 then a = 0 end
  redis.call('HSET', rec, 'status', 'FAILED_RETRYABLE', 'attempts', a, 'updated_ms', now)
else
  redis.call('HSET', rec, 'status', ARGV[3], 'updated_ms', now)
  if ARGV[5] ~= '' then
    redis.call('HSET', rec, 'last_error', ARGV[5], 'last_error_class', ARGV[6])
  end
end
redis.call('PEXPIRE', rec, ARGV[4])
index(r[5], ARGV[4])
if redis.call('GET', lease) == ARGV[1] .. ':' .. ARGV[2] then redis.call('DEL', lease) end
local id = ''
if ARGV[7] ~= '' then
  id = redis.call('XADD', dl, 'MINID', '~', string.format('%d', now - tonumber(ARGV[8])), '*',
    'scope', ARGV[14], 'message_id', ARGV[15], 'business_key', ARGV[16], 'record', r[5], 'reason', ARGV[7],
    'error', ARGV[5], 'error_class', ARGV[6], 'attempts', r[4], 'topic', ARGV[9], 'key', ARGV[10],
    'payload', ARGV[11], 'headers', ARGV[12], 'source', ARGV[13], 'created_ms', now)
  redis.call('HSET', rec, 'dead_letter', id)
end
return {1, id}
`)

// rejectScript records bad input without running a handler. A record
// that ended makes the copy a duplicate; a live lease makes it wait;
// otherwise the record (found by message ID or business key, or created)
// becomes FAILED_FINAL with a dead letter.
//
// KEYS: 1 record, 2 business-key index (or the record key), 3 lease,
// 4 dead-letter stream. ARGV: 1 message ID, 2 business key, 3 "1" when
// KEYS[1] is the record the business key pointed to, 4 that record's
// message ID, 5 final-record TTL ms, 6 error text, 7 error class, 8 reason,
// 9 dead-letter retention ms, 10 topic, 11 key, 12 payload, 13 headers
// JSON, 14 source, 15 scope, 16 reconsume times, 17 a token fresh for
// each Reject call. Replies {"BK", message ID}, {"GONE"} as claimScript;
// {"DUP"|"HELD", status, attempts, matched}; {"DEAD", attempts, dead-letter
// ID, matched}. A second run with the same token returns the first run's
// "DEAD" reply.
var rejectScript = redis.NewScript(prelude + routing + `
local rec, bki, lease, dl = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mid, bk = ARGV[1], ARGV[2]
local r = redis.call('HMGET', rec, 'status', 'attempts', 'message_id', 'business_key', 'closed_by', 'dead_letter')
local st, attempts, recmid, recbk = r[1], tonumber(r[2] or '0'), r[3] or mid, r[4] or ''
local matched = 'message_id'
if recmid ~= mid then matched = 'business_key' end
if st and r[5] == ARGV[17] then return {'DEAD', attempts, r[6] or '', matched} end -- a second run (see prelude)
if not st then
  local elsewhere = route()
  if elsewhere then return elsewhere end
  redis.call('HSET', rec, 'scope', ARGV[15], 'message_id', mid, 'business_key', bk, 'attempts', 0,
    'fence', 0, 'fingerprint', '', 'created_ms', now)
  recbk = bk
elseif st == 'SUCCEEDED' or st == 'FAILED_FINAL' then
  return {'DUP', st, attempts, matched}
elseif st == 'PROCESSING' and redis.call('EXISTS', lease) == 1 then
  return {'HELD', st, attempts, matched}
end
-- New, FAILED_RETRYABLE, or PROCESSING whose owner died: final.
redis.call('HSET', rec, 'status', 'FAILED_FINAL', 'last_error', ARGV[6], 'last_error_class', ARGV[7],
  'source', ARGV[14], 'reconsume_times', ARGV[16], 'updated_ms', now)
redis.call('HDEL', rec, 'owner')
redis.call('PEXPIRE', rec, ARGV[5])
if bk ~= '' and bk == recbk then index(recmid, ARGV[5]) end
local id = redis.call('XADD', dl, 'MINID', '~', string.format('%d', now - tonumber(ARGV[9])), '*',
  'scope', ARGV[15], 'message_id', mid, 'business_key', bk, 'record', recmid, 'reason', ARGV[8],
  'error', ARGV[6], 'error_class', ARGV[7], 'attempts', attempts, 'topic', ARGV[10], 'key', ARGV[11],
  'payload', ARGV[12], 'headers', ARGV[13], 'source', ARGV[14], 'created_ms', now)
redis.call('HSET', rec, 'closed_by', ARGV[17], 'dead_letter', id)
return {'DEAD', attempts, id, matched}
`)

// redriveScript makes a FAILED_FINAL record FAILED_RETRYABLE (attempts
// kept). KEYS: 1 record, 2 the record's business-key index (or the record
// key). ARGV: 1 record TTL ms, 2 a token fresh for each Redrive call, kept
// in the record's redriven_by. Replies the record's status before ("" when
// there is no record); a second run with the same token replies
// "FAILED_FINAL" again.
var redriveScript = redis.NewScript(prelude + `
local r = redis.call('HMGET', KEYS[1], 'status', 'redriven_by')
local st = r[1]
if not st then return '' end
if st ~= 'FAILED_FINAL' then
  if r[2] == ARGV[2] then return 'FAILED_FINAL' end -- a second run of this re-drive
  return st
end
redis.call('HSET', KEYS[1], 'status', 'FAILED_RETRYABLE', 'updated_ms', now, 'redriven_ms', now, 'redriven_by', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
index(redis.call('HGET', KEYS[1], 'message_id'), ARGV[1])
return st
`)
