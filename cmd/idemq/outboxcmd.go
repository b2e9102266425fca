package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/outbox"
	"github.com/spf13/cobra"
)

func (a *app) outboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Operate an outbox table: migrate, stats, parked rows, unpark, purge",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(a.outboxMigrateCommand(), a.outboxStatsCommand(), a.outboxParkedCommand(),
		a.outboxUnparkCommand(), a.outboxPurgeCommand())
	return cmd
}

func (a *app) outboxMigrateCommand() *cobra.Command {
	var d outboxFlags
	var mf migrateFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox table (--print: the SQL; --check: only verify)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mf.print {
				sql, err := outbox.MigrationSQL(outbox.Config{Schema: d.schema, Table: d.table})
				if err != nil {
					return usageError{err}
				}
				_, err = fmt.Fprint(a.stdout, sql)
				return err
			}
			ctx := cmd.Context()
			pool, ob, err := a.openOutbox(ctx, &d)
			if err != nil {
				return err
			}
			defer pool.Close()
			r := migrateResult{Schema: d.schema, Tables: []string{d.table}, Action: "checked"}
			if mf.check {
				if err := ob.CheckSchema(ctx); err != nil {
					return err
				}
				return a.printMigrate(mf.out, r, fmt.Sprintf("outbox table %q is current in schema %q", d.table, d.schema))
			}
			if err := ob.Migrate(ctx); err != nil {
				return err
			}
			r.Action = "migrated"
			return a.printMigrate(mf.out, r, fmt.Sprintf("outbox table %q migrated in schema %q", d.table, d.schema))
		},
	}
	d.register(cmd.Flags())
	mf.register(cmd)
	return cmd
}

// statsJSON is outbox stats' JSON.
type statsJSON struct {
	Pending               int64      `json:"pending"`
	FailingNow            int64      `json:"failing_now"`
	Parked                int64      `json:"parked"`
	Published             int64      `json:"published"`
	PublishedAfterFailure int64      `json:"published_after_failure"`
	LastErrorAt           *time.Time `json:"last_error_at"` // null when no failure is recorded
	OldestPendingSeconds  float64    `json:"oldest_pending_seconds"`
}

func (a *app) outboxStatsCommand() *cobra.Command {
	var d outboxFlags
	var out outputFormat
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Count pending (failing now), parked and published (after a failure) rows",
		Long: `Count the outbox table's rows: pending (failing_now: whose last attempt
failed), parked, published (published_after_failure: that failed before),
the last failure's time ("-" when none) and the age of the oldest pending
row (the relay lag).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, ob, err := a.openOutbox(ctx, &d)
			if err != nil {
				return err
			}
			defer pool.Close()
			s, err := ob.Stats(ctx)
			if err != nil {
				return err
			}
			if out == "json" {
				j := statsJSON{Pending: s.Pending, FailingNow: s.Failing, Parked: s.Parked, Published: s.Published,
					PublishedAfterFailure: s.PublishedAfterFailure, OldestPendingSeconds: s.OldestPending.Seconds()}
				if !s.LastErrorAt.IsZero() {
					t := s.LastErrorAt.UTC()
					j.LastErrorAt = &t
				}
				return writeJSON(a.stdout, j)
			}
			lastErr := "-"
			if !s.LastErrorAt.IsZero() {
				lastErr = s.LastErrorAt.UTC().Format(time.RFC3339)
			}
			_, err = fmt.Fprintf(a.stdout, "pending %d\nfailing_now %d\nparked %d\npublished %d\npublished_after_failure %d\nlast_error_at %s\noldest_pending %s\n",
				s.Pending, s.Failing, s.Parked, s.Published, s.PublishedAfterFailure, lastErr, s.OldestPending.Round(time.Millisecond))
			return err
		},
	}
	d.register(cmd.Flags())
	registerOutput(cmd.Flags(), &out)
	return cmd
}

// parkedJSON is one row of outbox parked's JSON.
type parkedJSON struct {
	ID        uuid.UUID  `json:"id"`
	Topic     string     `json:"topic"`
	Key       string     `json:"key"`
	Attempts  int        `json:"attempts"`
	ParkedAt  *time.Time `json:"parked_at"`
	LastError string     `json:"last_error"`
	CreatedAt time.Time  `json:"created_at"`
}

func (a *app) outboxParkedCommand() *cobra.Command {
	var d outboxFlags
	var out outputFormat
	var limit int
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "List parked rows, oldest first, with their last error",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 10000 {
				return usagef("--limit %d must be 1 to 10000", limit)
			}
			ctx := cmd.Context()
			pool, ob, err := a.openOutbox(ctx, &d)
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := ob.Parked(ctx, limit)
			if err != nil {
				return err
			}
			if out == "json" {
				js := make([]parkedJSON, 0, len(rows))
				for _, r := range rows {
					js = append(js, parkedJSON{ID: r.ID, Topic: r.Topic, Key: string(r.Key), Attempts: r.Attempts, ParkedAt: r.ParkedAt, LastError: r.LastError, CreatedAt: r.CreatedAt})
				}
				return writeJSON(a.stdout, js)
			}
			t := newTable(a.stdout, "ID\tTOPIC\tKEY\tATTEMPTS\tPARKED\tERROR")
			for _, r := range rows {
				parked := "-"
				if r.ParkedAt != nil {
					parked = r.ParkedAt.UTC().Format(time.RFC3339)
				}
				t.row("%s\t%s\t%q\t%d\t%s\t%.80s", r.ID, r.Topic, r.Key, r.Attempts, parked, r.LastError)
			}
			return t.flush()
		},
	}
	d.register(cmd.Flags())
	cmd.Flags().IntVar(&limit, "limit", 100, "rows to list; 1 to 10000")
	registerOutput(cmd.Flags(), &out)
	return cmd
}

// unparkJSON is outbox unpark's JSON.
type unparkJSON struct {
	Unparked int64 `json:"unparked"` // rows unparked (0 with dry_run)
	Matched  int64 `json:"matched"`  // parked rows selected
	DryRun   bool  `json:"dry_run"`
}

func (a *app) outboxUnparkCommand() *cobra.Command {
	var d outboxFlags
	var out outputFormat
	var all, dryRun bool
	var topic, key string
	cmd := &cobra.Command{
		Use:   "unpark (--all | --topic T | --key K | ID...)",
		Short: "Make parked rows publishable again: all, by topic and/or key, or by ID",
		Long: `Make parked rows publishable again now (attempts reset to 0, the last error
kept), and wake the relays: every parked row (--all), those of a topic
(--topic) and/or a key (--key), or the rows whose IDs are given (see idemq
outbox parked). --dry-run only counts them.`,
		Example: `  idemq outbox unpark --all --dry-run
  idemq outbox unpark --topic payments
  idemq outbox unpark 0191f5b4-6c1e-7c4e-9d1a-3b2f0e8a9c11`,
		RunE: func(cmd *cobra.Command, args []string) error {
			filtered := topic != "" || key != ""
			switch {
			case all && (filtered || len(args) > 0):
				return usagef("outbox unpark: --all selects every parked row: not with --topic, --key or IDs")
			case filtered && len(args) > 0:
				return usagef("outbox unpark: give IDs or --topic/--key, not both")
			case !all && !filtered && len(args) == 0:
				return usagef("outbox unpark: say which rows: --all, --topic T, --key K, or their IDs (see idemq outbox parked)")
			case cmd.Flags().Changed("topic") && topic == "", cmd.Flags().Changed("key") && key == "":
				return usagef("outbox unpark: --topic and --key must not be empty")
			}
			var ids []uuid.UUID
			for _, s := range args {
				id, err := uuid.Parse(s)
				if err != nil {
					return usagef("outbox unpark: ID %q: %v", s, err)
				}
				ids = append(ids, id)
			}
			ctx := cmd.Context()
			pool, ob, err := a.openOutbox(ctx, &d)
			if err != nil {
				return err
			}
			defer pool.Close()
			f := outbox.ParkedFilter{Topic: topic, Key: []byte(key)}
			var res unparkJSON
			res.DryRun = dryRun
			switch {
			case len(ids) > 0 && dryRun:
				res.Matched, err = countParkedIDs(ctx, ob, ids)
			case len(ids) > 0:
				res.Unparked, err = ob.Unpark(ctx, ids...)
				res.Matched = res.Unparked
			case dryRun:
				res.Matched, err = ob.CountParked(ctx, f)
			default:
				res.Unparked, err = ob.UnparkMatching(ctx, f)
				res.Matched = res.Unparked
			}
			if err != nil {
				return err
			}
			if out == "json" {
				return writeJSON(a.stdout, res)
			}
			if dryRun {
				_, err = fmt.Fprintf(a.stdout, "would unpark %d rows (dry run: nothing changed)\n", res.Matched)
			} else {
				_, err = fmt.Fprintf(a.stdout, "unparked %d rows\n", res.Unparked)
			}
			return err
		},
	}
	fs := cmd.Flags()
	d.register(fs)
	fs.BoolVar(&all, "all", false, "unpark every parked row")
	fs.StringVar(&topic, "topic", "", "unpark the parked rows of this topic")
	fs.StringVar(&key, "key", "", "unpark the parked rows of this key (with --topic: of that topic only)")
	fs.BoolVar(&dryRun, "dry-run", false, "count the rows that would be unparked; change nothing")
	registerOutput(fs, &out)
	return cmd
}

// countParkedIDs counts the parked, unpublished rows among ids.
func countParkedIDs(ctx context.Context, ob *outbox.Outbox, ids []uuid.UUID) (int64, error) {
	var n int64
	for _, id := range ids {
		r, err := ob.Get(ctx, id)
		if errors.Is(err, outbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if r.ParkedAt != nil && r.PublishedAt == nil {
			n++
		}
	}
	return n, nil
}

func (a *app) outboxPurgeCommand() *cobra.Command {
	var d outboxFlags
	var out outputFormat
	var olderThan, every time.Duration
	var batch int
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete published rows older than a retention",
		Long: `Delete the rows published more than --older-than ago (database time), in
statements of --batch rows, with a progress line on stderr. Unpublished and
parked rows are never deleted. A running relay does the same every
--purge-interval unless it runs with --no-purge.

Interrupted (SIGINT/SIGTERM), it reports how many rows it deleted (the
statement in flight rolls back) and exits 1.`,
		Example: `  idemq outbox purge --older-than 72h --batch 5000`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case batch < 1 || batch > 100000:
				return usagef("--batch %d must be 1 to 100000", batch)
			case olderThan < 0:
				return usagef("--older-than %s must not be negative", olderThan)
			case every < 0:
				return usagef("--progress %s must not be negative", every)
			}
			ctx := cmd.Context()
			pool, ob, err := a.openOutbox(ctx, &d)
			if err != nil {
				return err
			}
			defer pool.Close()
			p := newProgress(a.stderr, every)
			n, err := ob.PurgeWithProgress(ctx, olderThan, batch, p.step)
			if err == nil && ctx.Err() != nil {
				err = ctx.Err()
			}
			return a.purgeDone(ctx, out, "outbox purge", fmt.Sprintf("published rows older than %s", olderThan), n, p, err)
		},
	}
	fs := cmd.Flags()
	d.register(fs)
	fs.DurationVar(&olderThan, "older-than", 24*time.Hour, "delete rows published longer ago than this")
	fs.IntVar(&batch, "batch", 1000, "rows per delete statement; 1 to 100000")
	fs.DurationVar(&every, "progress", time.Second, "print the rows deleted so far and the rate on stderr at most this often (0: after every statement)")
	registerOutput(fs, &out)
	return cmd
}
