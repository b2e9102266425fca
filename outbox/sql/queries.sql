-- The outbox's statements (outbox.go, relay.go, admin.go). Loaded by name
-- (internal/namedsql); {{.outbox}} is the quoted, schema-qualified table
-- (Config.Schema, Config.Table), {{.channel}} its quoted NOTIFY channel, and
-- {{.notify}} is false when Config.DisableNotify is set.

-- fragment: row_columns
seq, id, topic, key, headers, payload, causation_id, created_at, available_at,
  attempts, coalesce(last_error, ''), last_error_at, last_attempt_at, parked_at, published_at, coalesce(published_by, '')

-- name: insert
-- One statement for any number of rows; the NOTIFY rides in the same round
-- trip and is delivered at commit (Postgres folds repeats within a
-- transaction into one). $8 is the channel name (a string argument, never
-- spliced).
with ins as (
  insert into {{.outbox}} (id, topic, key, headers, payload, causation_id, available_at)
  select u.id::uuid, u.topic, u.key, u.headers::jsonb, u.payload, u.causation_id,
         now() + make_interval(secs => u.delay)
  from unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::text[], $7::float8[])
       with ordinality as u(id, topic, key, headers, payload, causation_id, delay, ord)
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

-- name: keys
-- A walk over the keys with unpublished rows in (topic, key) order, from a
-- cursor, one index descent per key ("loose index scan"): the first index
-- entry of a key is its head. It makes every key with a ready head
-- reachable however deep the backlog behind other keys, at a cost of $3
-- descents.
with recursive k(topic, key, seq, n) as (
  (select topic, key, seq, 1 from {{.outbox}}
   where published_at is null and key is not null and (topic, key) > ($1::text, $2::bytea)
   order by topic, key, seq limit 1)
  union all
  (select t.topic, t.key, t.seq, k.n + 1 from k cross join lateral (
     select topic, key, seq from {{.outbox}}
     where published_at is null and key is not null and (topic, key) > (k.topic, k.key)
     order by topic, key, seq limit 1) t
   where k.n < $3)
)
select topic, key, seq from k;

-- name: heads
-- The earliest unpublished row of each key (or any keyless row), ready now,
-- not parked, taken from three bounded candidate sets: the first row of each
-- key among the oldest $1 unpublished rows (first in, first out), the key
-- walk's heads ($2), and the oldest ready keyless rows. A key whose head
-- another relay has locked is skipped (SKIP LOCKED), and its later rows are
-- not heads (an earlier unpublished row exists), so no two relays ever work
-- on one key at once. The NOT EXISTS sees committed state: a head locked by
-- another relay still counts as unpublished.
select o.seq, o.id, o.topic, o.key, o.headers, o.payload, o.causation_id, o.attempts
from {{.outbox}} o
where o.seq in (
    (select distinct on (w.topic, w.key) w.seq from (
       select seq, topic, key from {{.outbox}} where published_at is null order by seq limit $1) w
     where w.key is not null
     order by w.topic, w.key, w.seq)
    union all
    (select unnest($2::bigint[]))
    union all
    (select seq from {{.outbox}}
     where published_at is null and key is null and parked_at is null and available_at <= now()
     order by seq limit $3))
  and o.published_at is null and o.parked_at is null and o.available_at <= now()
  and (o.key is null or not exists (
    select 1 from {{.outbox}} e
    where e.topic = o.topic and e.key = o.key and e.published_at is null and e.seq < o.seq))
order by o.seq
limit $3
for update of o skip locked;

-- name: followers
-- Up to $4 later unpublished rows of each key whose head this transaction
-- holds, in seq order. They need no lock of their own: while a head is
-- locked and unpublished no other relay can reach them. ready is false for
-- a row that must hold back its key (delayed or parked).
select f.seq, f.id, f.topic, f.key, f.headers, f.payload, f.causation_id, f.attempts,
       (f.parked_at is null and f.available_at <= now()) as ready
from unnest($1::text[], $2::bytea[], $3::bigint[]) as h(topic, key, seq)
cross join lateral (
  select * from {{.outbox}} f
  where f.topic = h.topic and f.key = h.key and f.seq > h.seq and f.published_at is null
  order by f.seq
  limit $4) f
order by f.seq;

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
