-- Re-drives as new (Store.RedriveAsNew, `idemq redrive -as-new`): one audit row
-- per dead letter re-driven under a derived message ID,
-- "<message_id>#redrive-<dead_letter_id>". The unique dead_letter_id makes the
-- action idempotent: a second request finds the first row. published_at is
-- set once the broker acknowledged the republished message; a row without it
-- was requested, and a repeated request publishes it.
create table if not exists {{.redrives}} (
  id              bigint generated always as identity primary key,
  dead_letter_id  bigint      not null references {{.dead_letters}} (id),
  scope           text        not null,
  message_id      text        not null,
  new_message_id  text        not null,
  business_key    text        not null default '',
  reason          text        not null,
  forced          boolean     not null default false,
  operator        text        not null default '',
  created_at      timestamptz not null default now(),
  published_at    timestamptz
);

create unique index if not exists {{.redrives_dead_letter_key}}
  on {{.redrives}} (dead_letter_id);
