-- Retention of dead letters (purge_dead_letters.go) and the maintenance
-- loop (maintenance.go), apart from sql/*.sql so that the per-message
-- statements stay as they are.

-- name: dead_letters_purge_bound
-- The highest dead letter id when a purge starts: it walks no further.
select coalesce(max(id), 0) from {{.dead_letters}};

-- name: dead_letters_purge
-- One step of Store.PurgeDeadLetters' walk, like the records' purge
-- (sql/admin.sql, "purge"): the next $2 dead letters after id $1 (up to id
-- $3) in primary-key order, and of those the ones created more than $4
-- seconds ago deleted, re-driven or not, with their re-drive audit rows
-- (the audit references the dead letter). A dead letter whose re-drive as
-- new was requested but not yet published (an audit row without
-- published_at) is kept: a repeated request publishes it from the dead
-- letter. Returns the last id walked (null: nothing left), how many dead
-- letters were deleted, and whether every dead letter of the step was
-- created less than $4 seconds ago (the frontier: the walk stops there).
with step as materialized (
  select id, created_at >= now() - make_interval(secs => $4::float8) as young
  from {{.dead_letters}} where id > $1 and id <= $3 order by id limit $2),
doomed as materialized (
  select d.id from {{.dead_letters}} d
  where d.id > $1 and d.id <= (select max(id) from step)
    and d.created_at < now() - make_interval(secs => $4::float8)
    and not exists (select 1 from {{.redrives}} r where r.dead_letter_id = d.id and r.published_at is null)),
audit as (
  delete from {{.redrives}} r where r.dead_letter_id in (select id from doomed) returning 1),
gone as (
  delete from {{.dead_letters}} d where d.id in (select id from doomed) returning 1)
select max(id), (select count(*) from gone), coalesce(bool_and(young), false) from step;
