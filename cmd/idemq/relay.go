package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/idemq/idemq/outbox/rocketmqpub"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// closingPublisher is an outbox publisher the CLI closes when done.
type closingPublisher interface {
	outbox.Publisher
	Close() error
}

// brokerFlags are every broker connection flag of the CLI (relay, and
// redrive --as-new), in one place, Kafka TLS/SASL (kafkapub.Config.Transport)
// and RocketMQ ACL credentials (rocketmqpub.Config.Credentials) included.
type brokerFlags struct {
	broker       string
	kafkaBrokers string
	namesrv      string
	createTopics bool
	partitions   int
	sec          brokerSecFlags
}

func (b *brokerFlags) register(fs *pflag.FlagSet, forRelay bool) {
	fs.StringVar(&b.broker, "broker", "kafka", "where messages are published: kafka or rocketmq")
	bindEnv(fs, "broker", "IDEMQ_BROKER")
	fs.StringVar(&b.kafkaBrokers, "kafka-brokers", "", "Kafka bootstrap brokers, comma separated host:port (required with --broker kafka)")
	bindEnv(fs, "kafka-brokers", "IDEMQ_KAFKA_BROKERS")
	fs.StringVar(&b.namesrv, "rocketmq-namesrv", "", "RocketMQ NameServers, comma separated host:port (required with --broker rocketmq)")
	bindEnv(fs, "rocketmq-namesrv", "IDEMQ_ROCKETMQ_NAMESRV")
	b.partitions = 1
	if forRelay {
		fs.BoolVar(&b.createTopics, "create-topics", false, "Kafka: create missing topics before publishing to them")
		fs.IntVar(&b.partitions, "partitions", 1, "Kafka: partitions of topics made by --create-topics")
	}
	b.sec.register(fs)
}

// check validates the broker flags (usage errors) and resolves the
// broker secrets (a remembers them for redaction).
func (b *brokerFlags) check(a *app) error {
	switch b.broker {
	case "kafka":
		if len(splitList(b.kafkaBrokers)) == 0 {
			return usagef("--kafka-brokers (or IDEMQ_KAFKA_BROKERS) is required with --broker kafka")
		}
		if b.partitions < 1 {
			return usagef("--partitions %d must be at least 1", b.partitions)
		}
	case "rocketmq":
		if len(splitList(b.namesrv)) == 0 {
			return usagef("--rocketmq-namesrv (or IDEMQ_ROCKETMQ_NAMESRV) is required with --broker rocketmq")
		}
	default:
		return usagef("--broker %q: want kafka or rocketmq", b.broker)
	}
	return b.sec.check(a, b.broker)
}

// publisher makes the publisher the flags name (after check). Kafka's
// Transport (nil when PLAINTEXT) also carries --create-topics' requests.
func (b *brokerFlags) publisher() (closingPublisher, error) {
	if b.broker == "rocketmq" {
		return rocketmqpub.New(rocketmqpub.Config{NameServers: splitList(b.namesrv), Credentials: b.sec.cred})
	}
	rt, err := b.sec.sec.Transport()
	if err != nil {
		return nil, err
	}
	return kafkapub.New(kafkapub.Config{Brokers: splitList(b.kafkaBrokers), Transport: rt, CreateTopics: b.createTopics, TopicPartitions: b.partitions})
}

// outboxFlags name the outbox table.
type outboxFlags struct {
	dbFlags
	table string
}

func (d *outboxFlags) register(fs *pflag.FlagSet) {
	d.dbFlags.register(fs)
	fs.StringVar(&d.table, "table", "outbox", "outbox table")
	bindEnv(fs, "table", "IDEMQ_OUTBOX_TABLE")
}

// openOutbox checks the flags (usage errors) and opens the outbox; the pool
// connects at the first query.
func (a *app) openOutbox(ctx context.Context, d *outboxFlags) (*pgxpool.Pool, *outbox.Outbox, error) {
	if d.table == "" {
		return nil, nil, usagef("--table must not be empty")
	}
	pool, err := a.openPool(ctx, &d.dbFlags)
	if err != nil {
		return nil, nil, err
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: d.schema, Table: d.table})
	if err != nil {
		pool.Close()
		if errors.Is(err, outbox.ErrInvalidConfig) {
			err = usageError{err}
		}
		return nil, nil, err
	}
	return pool, ob, nil
}

// logFlags choose the relay's logs: format and level, on stderr.
type logFlags struct {
	format  string
	verbose bool
}

func (l *logFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format on stderr: text or json (slog; the final error too)")
	bindEnv(fs, "log-format", "IDEMQ_LOG_FORMAT")
	fs.BoolVarP(&l.verbose, "verbose", "v", false, "debug logs")
}

// logger returns the slog logger the flags name, writing to w.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	level := slog.LevelInfo
	if l.verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", l.format)
}

// relayFlagNames maps the RelayConfig fields to their flags, to name the
// flag in the library's validation errors.
var relayFlagNames = map[string]string{
	"Name": "--name", "BatchSize": "--batch-size", "MaxKeys": "--max-keys", "Workers": "--workers",
	"PollInterval": "--poll-interval", "FallbackPollInterval": "--fallback-poll-interval",
	"PublishTimeout": "--publish-timeout", "RetryInitial": "--retry-initial", "RetryMax": "--retry-max",
	"MaxAttempts": "--max-attempts", "OutageBackoffInitial": "--outage-backoff-initial",
	"OutageBackoffMax": "--outage-backoff-max", "MaxErrorBytes": "--max-error-bytes",
	"Retention": "--retention", "PurgeInterval": "--purge-interval", "PurgeBatch": "--purge-batch",
	"ShutdownGrace": "--shutdown-grace", "DisablePurge": "--no-purge",
}

// flagNamed rewrites RelayConfig field names in msg as the flags' names.
func flagNamed(msg string) string {
	fields := make([]string, 0, len(relayFlagNames))
	for f := range relayFlagNames {
		fields = append(fields, f)
	}
	sort.Slice(fields, func(i, j int) bool { return len(fields[i]) > len(fields[j]) })
	for _, f := range fields {
		msg = strings.ReplaceAll(msg, f, relayFlagNames[f])
	}
	return msg
}

// registerRelayConfig adds a flag for every RelayConfig field (Logger and
// TracerProvider aside: --log-format and the global OpenTelemetry provider).
func registerRelayConfig(fs *pflag.FlagSet, c *outbox.RelayConfig) {
	fs.StringVar(&c.Name, "name", "", "relay instance name, in logs and the published_by column (default <host>-<pid>-<random>)")
	fs.IntVar(&c.BatchSize, "batch-size", 500, "most rows per claim transaction; 1 to 10000")
	fs.IntVar(&c.MaxKeys, "max-keys", 0, "most keys per claim transaction; 1 to --batch-size (default --batch-size)")
	fs.IntVar(&c.Workers, "workers", 1, "concurrent claim transactions; 1 to 64")
	fs.DurationVar(&c.PollInterval, "poll-interval", time.Second, "how often an idle worker looks for rows without a notification; 10ms to 1h")
	fs.DurationVar(&c.FallbackPollInterval, "fallback-poll-interval", 0, "poll interval while the LISTEN connection is down; 10ms to --poll-interval (default 1s or --poll-interval, the shorter)")
	fs.BoolVar(&c.DisableListen, "no-listen", false, "poll only (no LISTEN connection)")
	fs.DurationVar(&c.PublishTimeout, "publish-timeout", 30*time.Second, "bound of one publish call; 100ms to 10m")
	fs.DurationVar(&c.RetryInitial, "retry-initial", time.Second, "first retry delay after a failed publish (doubles up to --retry-max)")
	fs.DurationVar(&c.RetryMax, "retry-max", 5*time.Minute, "retry delay cap; at most 24h")
	fs.IntVar(&c.MaxAttempts, "max-attempts", 25, "failed publishes (row errors, not outages) before a row is parked; 1 to 1000000")
	fs.DurationVar(&c.OutageBackoffInitial, "outage-backoff-initial", time.Second, "pause of publishing when the broker is unavailable (doubles up to --outage-backoff-max); at least 10ms")
	fs.DurationVar(&c.OutageBackoffMax, "outage-backoff-max", time.Minute, "cap of the outage pause; at most 1h")
	fs.IntVar(&c.MaxErrorBytes, "max-error-bytes", 2048, "bound of the stored last_error text, in bytes; at least 64")
	fs.DurationVar(&c.Retention, "retention", 24*time.Hour, "keep published rows this long before purging them")
	fs.BoolVar(&c.DisablePurge, "no-purge", false, "never purge published rows (not with --retention, --purge-interval, --purge-batch)")
	fs.DurationVar(&c.PurgeInterval, "purge-interval", time.Minute, "how often the relay purges; at least 1s")
	fs.IntVar(&c.PurgeBatch, "purge-batch", 1000, "rows per purge statement; 1 to 100000")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 10*time.Second, "how long in-flight batches may finish after SIGINT/SIGTERM")
}

func (a *app) relayCommand() *cobra.Command {
	var d outboxFlags
	var b brokerFlags
	var lf logFlags
	var cfg outbox.RelayConfig
	var migrate, once bool
	var metricsAddr string
	var out outputFormat
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Run an outbox relay until SIGINT/SIGTERM, or drain the outbox once (--once)",
		Long: `Publish the outbox table's rows to Kafka or RocketMQ and mark them published,
until SIGINT/SIGTERM (then in-flight batches get --shutdown-grace).

--once drains instead (cron-style): it publishes batches until none is ready,
prints the totals and how many rows stayed pending, and exits 1 when the
broker failed (those rows are retried by a later run).

--metrics-addr serves /metrics (Prometheus: the relay's counters and the
outbox's rows and lag), /healthz (the process is up) and /readyz (the relay
is running and its outbox table answers).`,
		Example: `  idemq relay --dsn "$IDEMQ_DATABASE_URL" --kafka-brokers kafka:9092 --metrics-addr :9464 --log-format json
  idemq relay --once --broker rocketmq --rocketmq-namesrv ns:9876
  IDEMQ_KAFKA_SASL_PASSWORD=… idemq relay --kafka-brokers kafka:9094 --kafka-tls-ca ca.pem --kafka-sasl-mechanism scram-sha-512 --kafka-sasl-user relay`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := lf.logger(a.stderr)
			if err != nil {
				return err
			}
			if lf.format == "json" {
				a.logger = log
			}
			if err := b.check(a); err != nil {
				return err
			}
			if cfg.DisablePurge {
				for _, n := range []string{"retention", "purge-interval", "purge-batch"} {
					if cmd.Flags().Changed(n) {
						return usagef("--%s is not for --no-purge", n)
					}
				}
				cfg.Retention, cfg.PurgeInterval, cfg.PurgeBatch = 0, 0, 0
			}
			if metricsAddr != "" {
				if once {
					return usagef("--metrics-addr is not for --once")
				}
				if _, _, err := net.SplitHostPort(metricsAddr); err != nil {
					return usagef("--metrics-addr %q: %v", metricsAddr, err)
				}
			}
			if cmd.Flags().Changed("output") && !once {
				return usagef("--output is for --once (the summary it prints)")
			}
			cfg.Logger = log
			ctx := cmd.Context()
			pool, ob, err := a.openOutbox(ctx, &d)
			if err != nil {
				return err
			}
			defer pool.Close()
			// NewRelay validates the configuration without touching the
			// database: check it before connecting anywhere.
			if _, err := outbox.NewRelay(ob, outbox.PublisherFunc(func(context.Context, []outbox.Envelope) error { return nil }), cfg); err != nil {
				return usageError{errors.New(flagNamed(err.Error()))}
			}
			pub, err := b.publisher()
			if err != nil {
				return err
			}
			defer func() { _ = pub.Close() }() // the relay has stopped: nothing is left to publish
			pub, lastErr := withLastErr(pub)
			r, err := outbox.NewRelay(ob, pub, cfg)
			if err != nil {
				return err
			}
			pc, _ := a.poolConfig(&d.dbFlags)
			log.InfoContext(ctx, "idemq: relay starting", "database", redactedDSN(pc), "schema", d.schema, "table", d.table, "broker", b.broker, "broker_security", b.sec.describe(b.broker), "once", once)
			if migrate {
				if err := ob.Migrate(ctx); err != nil {
					return err
				}
			}
			if once {
				return a.drain(ctx, r, ob, out, lastErr)
			}
			if metricsAddr != "" {
				stop, err := serveMetrics(ctx, metricsAddr, r, ob, log)
				if err != nil {
					return err
				}
				defer stop()
			}
			return r.Run(ctx)
		},
	}
	fs := cmd.Flags()
	d.register(fs)
	b.register(fs, true)
	registerRelayConfig(fs, &cfg)
	fs.BoolVar(&migrate, "migrate", true, "create or upgrade the outbox table at start (--migrate=false with a data-only role)")
	fs.BoolVar(&once, "once", false, "drain and exit: publish batches until none is ready (no LISTEN, no purge), instead of running until stopped")
	fs.StringVar(&metricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this address, e.g. :9464 or 127.0.0.1:9464")
	bindEnv(fs, "metrics-addr", "IDEMQ_METRICS_ADDR")
	lf.register(fs)
	registerOutput(fs, &out)
	return cmd
}

// serveMetrics listens on addr and serves /metrics (a registry of its own
// with r's and ob's collectors and the Go and process collectors),
// /healthz and /readyz. stop shuts the server down.
func serveMetrics(ctx context.Context, addr string, r *outbox.Relay, ob *outbox.Outbox, log *slog.Logger) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	if err := reg.Register(r.Collector()); err != nil {
		return nil, err
	}
	if err := reg.Register(ob.Collector(0)); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		rctx, cancel := context.WithTimeout(req.Context(), 3*time.Second)
		defer cancel()
		if err := r.Ready(rctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.InfoContext(ctx, "idemq: metrics listening", "metrics_addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

// drainResult is relay --once's summary.
type drainResult struct {
	Published   int   `json:"published"`
	Failed      int   `json:"failed"`
	Unavailable int   `json:"unavailable"`
	Parked      int   `json:"parked"`
	Pending     int64 `json:"pending"`
}

// drain runs batches (Relay.RunOnce) until one claims nothing, or publishes
// nothing (every row of it failed: the broker is likely down, and the rows'
// retries are scheduled for a later run). Failed rows are recorded as under
// Run (retry time, attempts, parking). It prints the totals and the rows
// still pending, and fails (exit 1) when the broker failed a publish (the
// error ends with lastErr's, the publisher's last error), on the
// first database error, or when ctx ends.
func (a *app) drain(ctx context.Context, r *outbox.Relay, ob *outbox.Outbox, out outputFormat, lastErr func() error) error {
	var total drainResult
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("relay --once interrupted after publishing %d rows: %w", total.Published, err)
		}
		res, err := r.RunOnce(ctx)
		if err != nil {
			return fmt.Errorf("relay --once: %w", err)
		}
		total.Published += res.Published
		total.Failed += res.Failed
		total.Unavailable += res.Unavailable
		total.Parked += res.Parked
		// A batch whose rows all failed claims them again only after their
		// retry delay, so the loop ends even while the broker is down.
		if res.Claimed == 0 || res.Published == 0 {
			break
		}
	}
	st, err := ob.Stats(ctx)
	if err != nil {
		return err
	}
	total.Pending = st.Pending
	if out == "json" {
		err = writeJSON(a.stdout, total)
	} else {
		_, err = fmt.Fprintf(a.stdout, "published %d\nfailed %d\nunavailable %d\nparked %d\npending %d\n",
			total.Published, total.Failed, total.Unavailable, total.Parked, total.Pending)
	}
	if err != nil {
		return err
	}
	if total.Failed > 0 || total.Unavailable > 0 {
		err := fmt.Errorf("relay --once: the broker failed %d publishes; %d rows stay pending (a later run retries them)", total.Failed+total.Unavailable, total.Pending)
		if last := lastErr(); last != nil {
			err = fmt.Errorf("%w; last error: %w", err, last)
		}
		return err
	}
	return nil
}
