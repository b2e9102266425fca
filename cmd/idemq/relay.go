package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/idemq/idemq/internal/devenv"

	"github.com/google/uuid"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/idemq/idemq/outbox/rocketmqpub"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dbFlags are the flags every command takes: the database and the schema of
// idemq's tables.
type dbFlags struct {
	dsn, schema string
}

func (d *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.dsn, "dsn", devenv.Get("IDEMQ_DATABASE_URL", devenv.PostgresDSN()), "Postgres DSN")
	fs.StringVar(&d.schema, "schema", "idemq", "schema of idemq's tables")
}

// outboxFlags name the outbox table.
type outboxFlags struct {
	dbFlags
	table string
}

func (d *outboxFlags) register(fs *flag.FlagSet) {
	d.dbFlags.register(fs)
	fs.StringVar(&d.table, "table", "outbox", "outbox table")
}

func (d *outboxFlags) open(ctx context.Context) (*pgxpool.Pool, *outbox.Outbox, error) {
	pool, err := pgxpool.New(ctx, d.dsn)
	if err != nil {
		return nil, nil, err
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: d.schema, Table: d.table})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, ob, nil
}

func runRelay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	var d outboxFlags
	d.register(fs)
	broker := fs.String("broker", "kafka", "kafka or rocketmq")
	kafkaBrokers := fs.String("kafka-brokers", devenv.KafkaBrokers(), "Kafka bootstrap brokers, comma separated")
	createTopics := fs.Bool("create-topics", false, "Kafka: create missing topics before publishing to them")
	partitions := fs.Int("partitions", 1, "Kafka: partitions of topics made by -create-topics")
	namesrv := fs.String("rocketmq-namesrv", devenv.RocketMQNamesrv(), "RocketMQ NameServers, comma separated")
	migrate := fs.Bool("migrate", true, "create or upgrade the outbox table at start")
	var cfg outbox.RelayConfig
	fs.StringVar(&cfg.Name, "name", "", "relay instance name (default host-pid-random)")
	fs.IntVar(&cfg.BatchSize, "batch-size", 500, "rows per claim transaction")
	fs.IntVar(&cfg.MaxKeys, "max-keys", 0, "keys per claim transaction (default batch-size)")
	fs.IntVar(&cfg.Workers, "workers", 1, "concurrent claim transactions")
	fs.DurationVar(&cfg.PollInterval, "poll", time.Second, "poll interval (fallback to LISTEN/NOTIFY)")
	fs.BoolVar(&cfg.DisableListen, "no-listen", false, "poll only")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 25, "failed publishes before a row is parked")
	fs.DurationVar(&cfg.RetryInitial, "retry-initial", time.Second, "first retry delay after a failed publish")
	fs.DurationVar(&cfg.RetryMax, "retry-max", 5*time.Minute, "retry delay cap")
	fs.DurationVar(&cfg.Retention, "retention", 24*time.Hour, "keep published rows this long before purging them")
	fs.BoolVar(&cfg.DisablePurge, "no-purge", false, "never purge published rows (-retention is then ignored)")
	once := fs.Bool("once", false, "drain and exit: publish batches until none is ready (no LISTEN, no purge), instead of running until stopped")
	verbose := fs.Bool("v", false, "debug logs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.DisablePurge {
		cfg.Retention = 0
	}
	if *verbose {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}

	pool, ob, err := d.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *migrate {
		if err := ob.Migrate(ctx); err != nil {
			return err
		}
	}
	var pub outbox.Publisher
	switch *broker {
	case "kafka":
		p, err := kafkapub.New(kafkapub.Config{Brokers: strings.Split(*kafkaBrokers, ","), CreateTopics: *createTopics, TopicPartitions: *partitions})
		if err != nil {
			return err
		}
		defer func() { _ = p.Close() }() // the relay has stopped: nothing is left to publish
		pub = p
	case "rocketmq":
		p, err := rocketmqpub.New(rocketmqpub.Config{NameServers: strings.Split(*namesrv, ",")})
		if err != nil {
			return err
		}
		defer func() { _ = p.Close() }() // the relay has stopped: nothing is left to publish
		pub = p
	default:
		return fmt.Errorf("-broker %q: want kafka or rocketmq", *broker)
	}
	r, err := outbox.NewRelay(ob, pub, cfg)
	if err != nil {
		return err
	}
	if *once {
		return drain(ctx, r, os.Stdout)
	}
	return r.Run(ctx)
}

// drain runs batches (Relay.RunOnce) until one claims nothing, or publishes
// nothing (every row of it failed: the broker is likely down, and the rows'
// retries are scheduled for a later run). Failed rows are recorded as under
// Run (retry time, attempts, parking). It prints the totals and returns the
// first database error, or ctx's error.
func drain(ctx context.Context, r *outbox.Relay, w io.Writer) error {
	var total outbox.BatchResult
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		res, err := r.RunOnce(ctx)
		if err != nil {
			return fmt.Errorf("relay -once: %w", err)
		}
		total.Claimed += res.Claimed
		total.Published += res.Published
		total.Failed += res.Failed
		total.Parked += res.Parked
		// A batch whose rows all failed claims them again only after their
		// retry delay, so the loop ends even while the broker is down.
		if res.Claimed == 0 || res.Published == 0 {
			break
		}
	}
	_, err := fmt.Fprintf(w, "published %d\nfailed %d\nparked %d\n", total.Published, total.Failed, total.Parked)
	return err
}

func runOutbox(ctx context.Context, args []string) error {
	const usage = "usage: idemq outbox migrate|stats|parked|unpark [flags] (idemq outbox <command> -h for its flags)"
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(os.Stderr, usage)
		return flag.ErrHelp
	case "migrate", "stats", "parked", "unpark":
	default:
		return fmt.Errorf("unknown outbox command %q; %s", args[0], usage)
	}
	fs := flag.NewFlagSet("outbox "+args[0], flag.ContinueOnError)
	var d outboxFlags
	d.register(fs)
	var limit *int
	if args[0] == "parked" {
		limit = fs.Int("limit", 100, "rows to list")
	}
	var mf migrateFlags
	if args[0] == "migrate" {
		mf.register(fs)
	}
	if args[0] == "unpark" {
		fs.Usage = func() {
			_, _ = fmt.Fprintln(fs.Output(), "usage: idemq outbox unpark [flags] ID... (IDs of parked rows, from idemq outbox parked)")
			fs.PrintDefaults()
		}
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if args[0] == "unpark" && fs.NArg() == 0 {
		return errors.New("outbox unpark: give the IDs of the parked rows to unpark (see idemq outbox parked)")
	}
	if mf.print {
		return printOutboxSQL(os.Stdout, &d)
	}
	pool, ob, err := d.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch args[0] {
	case "migrate":
		if mf.check {
			if err := ob.CheckSchema(ctx); err != nil {
				return err
			}
			fmt.Printf("outbox table %q is current in schema %q\n", d.table, d.schema)
			return nil
		}
		if err := ob.Migrate(ctx); err != nil {
			return err
		}
		fmt.Printf("outbox table %q migrated in schema %q\n", d.table, d.schema)
	case "stats":
		s, err := ob.Stats(ctx)
		if err != nil {
			return err
		}
		printOutboxStats(os.Stdout, s)
	case "parked":
		rows, err := ob.Parked(ctx, *limit)
		if err != nil {
			return err
		}
		for _, r := range rows {
			fmt.Printf("%s\t%s\t%q\tattempts=%d\tparked=%s\terror=%s\n", r.ID, r.Topic, r.Key, r.Attempts, r.ParkedAt.Format(time.RFC3339), r.LastError)
		}
	case "unpark":
		var ids []uuid.UUID
		for _, a := range fs.Args() {
			id, err := uuid.Parse(a)
			if err != nil {
				return fmt.Errorf("unpark %q: %w", a, err)
			}
			ids = append(ids, id)
		}
		n, err := ob.Unpark(ctx, ids...)
		if err != nil {
			return err
		}
		fmt.Printf("unparked %d rows\n", n)
	}
	return nil
}

// printOutboxStats prints s one "name value" line each. failing_now (pending
// rows whose last attempt failed) and published_after_failure (published
// rows that failed before) tell a failure that is still going on from one
// that is over; last_error_at is "-" when no failure is recorded.
func printOutboxStats(w io.Writer, s outbox.Stats) {
	lastErr := "-"
	if !s.LastErrorAt.IsZero() {
		lastErr = s.LastErrorAt.UTC().Format(time.RFC3339)
	}
	_, _ = fmt.Fprintf(w, "pending %d\nfailing_now %d\nparked %d\npublished %d\npublished_after_failure %d\nlast_error_at %s\noldest_pending %s\n",
		s.Pending, s.Failing, s.Parked, s.Published, s.PublishedAfterFailure, lastErr, s.OldestPending.Round(time.Millisecond))
}
