-- Parked rows selected by topic and key, for Outbox.UnparkMatching and
-- Outbox.CountParked ($1 topic, $2 key; a null argument matches every row).

-- name: unpark_matching
update {{.outbox}}
set parked_at = null, attempts = 0, available_at = now()
where parked_at is not null and published_at is null
  and ($1::text is null or topic = $1) and ($2::bytea is null or key = $2);

-- name: count_parked_matching
select count(*) from {{.outbox}}
where parked_at is not null and published_at is null
  and ($1::text is null or topic = $1) and ($2::bytea is null or key = $2);
