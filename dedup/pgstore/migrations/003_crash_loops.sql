-- Crash loops: bounding a message whose handler kills the process (atomic and
-- batched modes; see the dedup package documentation, "Crash loops").
--
-- start_mark is written by Store.MarkStart before a handler run that may
-- replay a crash: the record's attempts at that moment. The run's own claim
-- counts the attempt in the handler's transaction, so a run that reaches an
-- outcome leaves attempts above start_mark; a run killed with its process
-- leaves attempts equal to it, which the next MarkStart counts. NULL: no
-- marked run. Adding a nullable column without a default rewrites nothing.
alter table {{.records}} add column if not exists start_mark integer;

-- One row per (scope, lane): the highest offset of the lane that a process may
-- have started a handler for (offset_hwm), written ahead of the lane by
-- consumer.Config.CrashLoop.Window offsets. A few rows per partition or
-- queue; never purged.
create table if not exists {{.lane_watermarks}} (
  scope      text        not null,
  lane       text        not null,
  offset_hwm bigint      not null,
  updated_at timestamptz not null default now(),
  primary key (scope, lane)
);
