// Command benchreport is `make bench`: in one run it measures the rooflines
// (what the same Postgres and Kafka do with the same work and no idemq:
// pgbench on tables of idemq's row shapes, pg_test_fsync, raw kafka-go) and
// the same workloads through idemq, and prints the ratios, the WAL syncs
// and allocations per message, the added latency and the targets
// (met or missed). It rewrites docs/benchmarks.md and its chart.
//
// It reads the services from TEST_POSTGRES_DSN, TEST_REDIS_ADDR and
// TEST_KAFKA_BROKERS (`eval "$(scripts/services.sh env)"`), works in
// schemas, topics, groups and Redis keys of its own, and drops them at the
// end. It exits non-zero only on errors: a missed target is reported, not
// a failure.
//
//	cd integration && go run ./cmd/benchreport [-runs 3] [-duration 3s] [-out ../docs/benchmarks.md]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"time"
)

// config is the command line.
type config struct {
	Runs      int            // interleaved runs per row; the median is reported
	Duration  time.Duration  // each timed Postgres run
	Warmup    time.Duration  // each warm-up run
	KafkaMsgs int            // messages of each Kafka consumption run
	RelayRows int            // rows of each relay run
	Repo      string         // the repository root (for `go test ./consumer` and docs/)
	Out       string         // the markdown file to write ("" : none)
	Chart     string         // the chart to write, SVG or PNG by extension ("": none)
	GoBin     string         // the go command
	Note      string         // a line added to the markdown
	Only      *regexp.Regexp // rows whose ID matches (nil: all)
	CPUProf   string         // write the process's CPU profile of the rounds here ("": none)
}

func main() {
	var cfg config
	flag.IntVar(&cfg.Runs, "runs", 3, "interleaved runs of each row (the median is reported)")
	flag.DurationVar(&cfg.Duration, "duration", 3*time.Second, "duration of each timed Postgres run (pgbench: whole seconds, at least 2)")
	flag.DurationVar(&cfg.Warmup, "warmup", time.Second, "duration of each warm-up run")
	flag.IntVar(&cfg.KafkaMsgs, "kafka-msgs", 10000, "messages of each Kafka consumption run")
	flag.IntVar(&cfg.RelayRows, "relay-rows", 10000, "rows of each relay run")
	flag.StringVar(&cfg.Repo, "repo", "..", "the repository root")
	flag.StringVar(&cfg.Out, "out", "../docs/benchmarks.md", "markdown report to write (empty: none)")
	flag.StringVar(&cfg.Chart, "chart", "../docs/benchmarks.svg", "chart to write, .svg or .png (empty: none)")
	flag.StringVar(&cfg.GoBin, "go", "go", "the go command, for go test -bench F0 ./consumer")
	flag.StringVar(&cfg.CPUProf, "cpuprofile", "", "write this process's CPU profile of the measured rounds to this file (go tool pprof -top)")
	verbose := flag.Bool("v", false, "log each run's rate and wall time")
	flag.StringVar(&cfg.Note, "note", "", "a line added to the markdown report (e.g. the machine's state)")
	only := flag.String("only", "", "measure only the rooflines and workloads whose ID matches this regular expression (a partial report: targets of the others are not measured)")
	flag.Parse()
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: -only:", err)
			os.Exit(2)
		}
		cfg.Only = re
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, cfg, log, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func (c config) validate() error {
	switch {
	case c.Runs < 1:
		return errors.New("-runs must be at least 1")
	case c.Duration < time.Second:
		return errors.New("-duration must be at least 1s")
	case c.Warmup < 0:
		return errors.New("-warmup must not be negative")
	case c.KafkaMsgs < 100:
		return errors.New("-kafka-msgs must be at least 100")
	case c.RelayRows < relayBatch:
		return fmt.Errorf("-relay-rows must be at least %d", relayBatch)
	}
	return nil
}

// run measures everything and writes the report.
func run(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	start := time.Now()
	b, err := newBench(ctx, cfg, log)
	if b != nil {
		defer b.close()
	}
	if err != nil {
		return err
	}
	rep := &report{Setup: setupInfo{Date: start, Cores: runtime.NumCPU(), CPU: cpuModel(), Runs: cfg.Runs,
		Duration: cfg.Duration, Warmup: cfg.Warmup, KafkaMsgs: cfg.KafkaMsgs, RelayRows: cfg.RelayRows, Note: cfg.Note}}
	if rep.Setup.PGVersion, rep.Setup.PGSettings, err = b.pgSetup(ctx); err != nil {
		return err
	}
	log.Info("pg_test_fsync")
	if rep.Setup.FsyncPerSec, rep.Setup.FsyncWhere, err = b.fsyncRate(ctx, cfg.Repo); err != nil {
		return err
	}

	rooflines, workloads := rooflines, workloads
	if cfg.Only != nil {
		rooflines = slices.DeleteFunc(slices.Clone(rooflines), func(r roofline) bool { return !cfg.Only.MatchString(r.ID) })
		workloads = slices.DeleteFunc(slices.Clone(workloads), func(w workload) bool { return !cfg.Only.MatchString(w.ID) })
	}
	// Setup, then one warm-up run of each, then the interleaved rounds.
	for _, r := range rooflines {
		if r.Setup != nil {
			if err := r.Setup(ctx, b); err != nil {
				return fmt.Errorf("%s: setup: %w", r.ID, err)
			}
		}
	}
	for _, w := range workloads {
		if w.Setup != nil {
			if err := w.Setup(ctx, b); err != nil {
				return fmt.Errorf("%s: setup: %w", w.ID, err)
			}
		}
	}
	if cfg.CPUProf != "" {
		f, err := os.Create(cfg.CPUProf)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	roof := make([][]sample, len(rooflines))
	idemq := make([][]sample, len(workloads))
	plain := make([][]sample, len(workloads))
	for round := 0; round <= cfg.Runs; round++ {
		warm := round == 0
		log.Info("round", "n", round, "warm-up", warm)
		for i, r := range rooflines {
			t := time.Now()
			s, err := r.Run(ctx, b, warm)
			if err != nil {
				return fmt.Errorf("roofline %s: %w", r.ID, err)
			}
			log.Debug("roofline", "id", r.ID, "msgs/s", int(s.rate()), "took", time.Since(t).Round(time.Millisecond))
			if !warm {
				roof[i] = append(roof[i], s)
			}
		}
		for i, w := range workloads {
			t := time.Now()
			s, p, err := runWorkload(ctx, b, w, warm)
			if err != nil {
				return fmt.Errorf("workload %s: %w", w.ID, err)
			}
			log.Debug("workload", "id", w.ID, "msgs/s", int(s.rate()), "took", time.Since(t).Round(time.Millisecond))
			if !warm {
				idemq[i] = append(idemq[i], s)
				if p != nil {
					plain[i] = append(plain[i], *p)
				}
			}
		}
	}
	for i, r := range rooflines {
		rep.Rooflines = append(rep.Rooflines, summarize(r.ID, r.Name, r.Conns, roof[i], nil, false))
	}
	for i, w := range workloads {
		x := row{result: summarize(w.ID, w.Name, w.Lanes, idemq[i], plain[i], true), Roofline: w.Roofline}
		if rf, ok := rep.lookup(w.Roofline); ok {
			x.RooflineName = fmt.Sprintf("%s, %d conn.", rf.Name, rf.Lanes)
			x.RooflineRate = rf.Rate
		}
		x.Ratio = ratio(x.Rate, x.RooflineRate)
		rep.Rows = append(rep.Rows, x)
	}

	log.Info("go test -bench F0 -benchmem ./consumer")
	out, err := runTool(ctx, cfg.Repo, cfg.GoBin, "test", "-run", "^$", "-bench", "F0", "-benchmem", "-count", "1", "./consumer")
	if err != nil {
		return err
	}
	if rep.F0, err = parseGoBench(out); err != nil {
		return err
	}
	rep.Targets = evaluate(rep, targets)

	if _, err := io.WriteString(stdout, stdoutReport(rep)); err != nil {
		return err
	}
	if cfg.Chart != "" {
		if err := drawChart(rep, cfg.Chart); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	if cfg.Out != "" {
		rel, err := filepath.Rel(filepath.Dir(cfg.Out), cfg.Chart)
		if err != nil || cfg.Chart == "" {
			rel = cfg.Chart
		}
		// #nosec G306 -- a document of the repository, readable like the others
		if err := os.WriteFile(cfg.Out, []byte(markdown(rep, filepath.ToSlash(rel))), 0o644); err != nil {
			return err
		}
	}
	log.Info("done", "took", time.Since(start).Round(time.Second), "markdown", cfg.Out, "chart", cfg.Chart)
	return nil
}

// runWorkload runs one workload once, and its plain baseline when it has
// one, at the same lanes.
func runWorkload(ctx context.Context, b *bench, w workload, warm bool) (sample, *sample, error) {
	if w.Op == nil {
		s, err := w.Run(ctx, b, warm)
		return s, nil, err
	}
	d := b.cfg.Duration
	if warm {
		d = b.cfg.Warmup
	}
	s, err := b.drive(ctx, w.ID, w.Lanes, d, w.Op(b))
	if err != nil || w.Plain == nil {
		return s, nil, err
	}
	p, err := b.drive(ctx, "plain-"+w.ID, w.Lanes, d/3, w.Plain(b))
	return s, &p, err
}

// targets are the targets, computed from the report.
var targets = []target{
	{Text: "Batched with BatchHandler ≥ 0.85 × the pipelined pgbench roofline at 4 connections, and ≥ 50,000 durable unique msgs/s at 4 lanes",
		Eval: both(atLeastRatio(0.85, [2]string{"batch-set-4", "pg-pipe100-4"}), atLeastRate("batch-set-4", 50000))},
	{Text: "Batched with a per-message Handler ≥ 0.7 × the pipelined pgbench roofline (4 lanes, 4 connections)",
		Eval: atLeastRatio(0.7, [2]string{"batched-4", "pg-pipe100-4"})},
	{Text: "Per-message ≥ 0.8 × pgbench per-message at 1, 8 and 32",
		Eval: atLeastRatio(0.8, [2]string{"per-message-1", "pg-tx-1"}, [2]string{"per-message-8", "pg-tx-8"}, [2]string{"per-message-32", "pg-tx-32"})},
	{Text: "Postgres-only duplicates ≥ 0.8 × the read-only check roofline, with 0 WAL syncs per duplicate",
		Eval: both(atLeastRatio(0.8, [2]string{"dup-pg-1", "pg-dup-1"}, [2]string{"dup-pg-batch100-1", "pg-dup100-1"}),
			walSyncsAtMost(0, "dup-pg-1", "dup-pg-batch100-1"))},
	{Text: "Redis fast path ≥ 3 × Postgres-only in every mode, batched included",
		Eval: atLeastRatio(3, [2]string{"dup-redis-1", "dup-pg-1"}, [2]string{"dup-redis-batch100-1", "dup-pg-batch100-1"})},
	{Text: "≥ 100 messages per WAL sync at batch 100",
		Eval: msgsPerSyncAtLeast(100, "batched-1", "batched-4")},
	{Text: "Relay ≥ 0.85 × the raw kafka-go Writer",
		Eval: atLeastRatio(0.85, [2]string{"relay", "kafka-write"})},
}

// chartLabel is a row's label on the chart: its ID (lanes last).
func chartLabel(x row) string { return x.ID }
