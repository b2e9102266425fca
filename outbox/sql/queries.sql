-- The outbox's statements (outbox.go, relay.go, admin.go). Loaded by name
-- (internal/namedsql); {{.outbox}} is the quoted, schema-qualified table
-- (Config.Schema, Config.Table), {{.channel}} its quoted NOTIFY channel, and
-- {{.notify}} is false when Config.DisableNotify is set.

-- fragment: row_columns
seq, id, topic, key, headers, payload, causation_id, created_at, available_at,
  attempts, coalesce(last_error, ''), last_error_at, last_attempt_at, parked_at, published_at, coalesce(published_by, ''),
  message_id

-- name: insert
-- One statement for any number of rows; the NOTIFY rides in the same round
-- trip and is delivered at commit (Postgres folds repeats within a
-- transaction into one). $8 is the channel name (a string argument, never
-- spliced). $9 are the caller-chosen message IDs ('' = the row's id).
with ins as (
  insert into {{.outbox}} (id, topic, key, headers, payload, causation_id, available_at, message_id)
  select u.id::uuid, u.topic, u.key, u.headers::jsonb, u.payload, u.causation_id,
         now() + make_interval(secs => u.delay), u.message_id
  from unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::text[], $7::float8[], $9::text[])
       with ordinality as u(id, topic, key, headers, payload, causation_id, delay, message_id, ord)
  order by u.ord
  returning 1
)
select count(*)::int, {{if .notify}}pg_notify($8, '') is null{{else}}$8::text is null{{end}} from ins;

-- name: lock_keys
-- Key locks: a transaction adding rows of a key holds a transaction-level
-- advisory lock on (table, topic, key) until it ends, so a second writer of
-- that key inserts (and takes its seq) only after the first commits: per-key
-- seq order is commit order, and no relay ever sees a later row of a key
-- committed while an earlier one is still in flight. Locks are taken in
-- sorted order within one call. $3 is the table's name as text.
select count(pg_advisory_xact_lock(l))::int from (
  select distinct hashtextextended($3 || E'\n' || u.t || E'\n' || encode(u.k, 'base64'), 0) as l
  from unnest($1::text[], $2::bytea[]) as u(t, k)
  where u.k is not null
  order by 1) s;

-- fragment: claim_rows
-- The body of both claims, after a CTE cand(seq) of head candidates: it
-- locks up to $1 heads (FOR UPDATE SKIP LOCKED: a key whose head another
-- relay holds is skipped whole), the ones due the longest first (a head
-- that waited out a retry delay queues again from its retry time), leaving
-- out the heads in $3 (the ones this transaction already holds), and reads
-- up to greatest(1, ($2 − heads) / keyed heads) later unpublished rows of
-- each head's key in seq order, so that about $2 rows come back in all. Every candidate is the earliest
-- unpublished row of its key in this statement's snapshot (the candidate
-- sets are built that way), and the followers are read in the same
-- snapshot, so no "is there an earlier row?" check is needed here; a head
-- that another transaction changed after the snapshot (published, failed,
-- parked) is re-checked on its latest version by the lock and dropped.
-- Followers need no lock of their own: while a head is locked and
-- unpublished no other relay can reach them. ready is false for a follower
-- that must hold back its key (delayed, or parked). The heads are found
-- with = any(array(…)) on the primary key, so the plan is index lookups
-- whatever the table's statistics say; "unpublished" is spelled
-- coalesce(published_at, '-infinity') = '-infinity' there so that the
-- partial indexes (published_at is null) are not candidates: on a table not
-- yet analyzed Postgres guesses that 0.5% of the rows are unpublished, and
-- would rather scan all of them. kind is 0 for a head, 1 for a follower;
-- available_at is when the row became due (the relay prefers the heads due
-- the longest when it has more candidates than MaxKeys).
h as materialized (
  select o.seq, o.id, o.topic, o.key, o.headers, o.payload, o.causation_id, o.attempts, o.message_id, o.available_at
  from {{.outbox}} o
  where o.seq = any(array(select seq from cand))
    and not o.seq = any(coalesce($3::bigint[], '{}'))
    and coalesce(o.published_at, '-infinity') = '-infinity'
    and o.parked_at is null and o.available_at <= now()
  order by o.available_at, o.seq
  limit $1
  for update of o skip locked),
n as materialized (
  select count(*)::int as heads, greatest(1, ($2::int - count(*)::int) / greatest(count(h.key)::int, 1)) as per_key
  from h),
r as (
  select 0 as kind, h.seq, h.id, h.topic, h.key, h.headers, h.payload, h.causation_id, h.attempts, true as ready, h.message_id,
         h.available_at
  from h
  union all
  select 1, f.seq, f.id, f.topic, f.key, f.headers, f.payload, f.causation_id, f.attempts,
         (f.parked_at is null and f.available_at <= now()), f.message_id, f.available_at
  from h cross join lateral (
    select * from {{.outbox}} f
    where f.topic = h.topic and f.key = h.key and f.seq > h.seq and f.published_at is null
    order by f.seq
    limit (select per_key from n)) f
  where h.key is not null and (select heads from n) < $2::int)

-- name: claim
-- The relay's claim, one statement (one snapshot), one round trip with its
-- BEGIN: head candidates are the first row of each key among the oldest $4
-- unpublished rows (first in, first out; every row of a key older than the
-- window's first is in the window, so that first is the key's head) and the
-- oldest $1 ready keyless rows. See claim_rows for $1–$3. full is true when
-- the window holds $4 rows: there may be unpublished rows beyond it (when
-- it is false, a walk over the keys would find no head the window did not).
with w as materialized (
  select seq, topic, key from {{.outbox}} where published_at is null order by seq limit $4),
cand as (
  (select distinct on (w.topic, w.key) w.seq from w
   where w.key is not null
   order by w.topic, w.key, w.seq)
  union all
  (select seq from {{.outbox}}
   where published_at is null and key is null and parked_at is null and available_at <= now()
   order by seq limit $1)),
{{template "claim_rows" .}}
select kind, seq, id, topic, key, headers, payload, causation_id, attempts, ready, message_id,
       (select count(*) from w) >= $4 as full, available_at
from r
order by kind, seq;

-- name: claim_walk
-- The relay's second claim in a transaction, run only when the first did not
-- fill the batch (the oldest rows are blocked: parked or delayed heads, heads
-- waiting out a retry delay, or keys other relays hold). Head candidates come
-- from a walk over the keys with unpublished rows in (topic, key) order from
-- a cursor ($4, $5), one index descent per key ("loose index scan"): the
-- first index entry of a key is its head. A key whose head is not due
-- (parked, or available_at still ahead, by the database's clock), or is in
-- $3, is stepped over without counting: the walk stops once it has seen $1
-- due heads, or visited $6 keys, or run out of keys, so blocked keys never
-- take a batch's place however many sort before a ready one. It makes every
-- key with a ready head reachable however deep the backlog behind other
-- keys. See claim_rows for $1–$3. A last row (kind 2) reports the walk: seq
-- is how many keys it visited, topic and key the last one (the next cursor),
-- ready whether it ran out of keys (the next walk starts over).
with recursive k(topic, key, seq, due, n, d) as (
  (select topic, key, seq, x.due, 1, x.due::int from (
     select topic, key, seq, parked_at, available_at from {{.outbox}}
     where published_at is null and key is not null and (topic, key) > ($4::text, $5::bytea)
     order by topic, key, seq limit 1) f
   cross join lateral (select f.parked_at is null and f.available_at <= now()
                              and not f.seq = any(coalesce($3::bigint[], '{}')) as due) x)
  union all
  (select t.topic, t.key, t.seq, t.due, k.n + 1, k.d + t.due::int from k cross join lateral (
     select f.topic, f.key, f.seq,
            f.parked_at is null and f.available_at <= now() and not f.seq = any(coalesce($3::bigint[], '{}')) as due
     from {{.outbox}} f
     where f.published_at is null and f.key is not null and (f.topic, f.key) > (k.topic, k.key)
     order by f.topic, f.key, f.seq limit 1) t
   where k.n < $6 and k.d < $1)
),
last as (select topic, key, n, d from k order by n desc limit 1),
cand as (select seq from k where due),
{{template "claim_rows" .}}
select kind, seq, id, topic, key, headers, payload, causation_id, attempts, ready, message_id, true as full, available_at from r
union all
select 2, coalesce((select n from last), 0)::bigint, '00000000-0000-0000-0000-000000000000'::uuid,
       coalesce((select topic from last), ''), (select key from last), '{}'::jsonb, null::bytea, '', 0,
       coalesce((select n < $6 and d < $1 from last), true), '', true, now()
order by 1, 2;

-- name: mark_published
update {{.outbox}}
set published_at = now(), published_by = $2, attempts = attempts + 1, last_attempt_at = now()
where seq = any($1::bigint[]) and published_at is null;

-- name: mark_failed
update {{.outbox}} o
set attempts = o.attempts + 1, last_error = u.err, last_error_at = now(), last_attempt_at = now(),
    available_at = now() + make_interval(secs => u.delay),
    parked_at = case when o.attempts + 1 >= $4 then now() end
from unnest($1::bigint[], $2::text[], $3::float8[]) as u(seq, err, delay)
where o.seq = u.seq and o.published_at is null
returning o.seq, o.id, o.parked_at is not null;

-- name: purge
delete from {{.outbox}}
where seq in (
  select seq from {{.outbox}}
  where published_at < now() - make_interval(secs => $1)
  order by published_at
  limit $2
  for update skip locked);

-- name: listen
listen {{.channel}};

-- name: notify
select pg_notify($1, '');

-- name: probe
-- The relay's start-up check that the table exists and can be read.
select 1 from {{.outbox}} limit 0;

-- name: get
select {{template "row_columns"}} from {{.outbox}} where id = $1;

-- name: list_all
select {{template "row_columns"}} from {{.outbox}} where seq > $1 order by seq limit $2;

-- name: list_pending
select {{template "row_columns"}} from {{.outbox}} where seq > $1 and published_at is null order by seq limit $2;

-- name: list_parked
select {{template "row_columns"}} from {{.outbox}}
where parked_at is not null and published_at is null and seq > $1 order by seq limit $2;

-- name: unpark
update {{.outbox}}
set parked_at = null, attempts = 0, available_at = now()
where id = any($1) and parked_at is not null and published_at is null;

-- name: stats
select
  count(*) filter (where published_at is null and parked_at is null),
  count(*) filter (where published_at is null and parked_at is null and last_error is not null),
  count(*) filter (where published_at is null and parked_at is not null),
  count(*) filter (where published_at is not null),
  count(*) filter (where published_at is not null and last_error is not null),
  max(last_error_at),
  coalesce(extract(epoch from now() - min(created_at) filter (where published_at is null and parked_at is null)), 0)::float8
from {{.outbox}};
