package main

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file holds the report's pure parts: parsing the tools' output,
// medians and percentiles, ratios, the targets, and the rendering of the
// table and of docs/benchmarks.md. report_test.go tests them.

// sample is one timed run of a workload or a roofline.
type sample struct {
	Msgs    int64         // messages done (pgbench: transactions × messages per transaction)
	Elapsed time.Duration // the timed part
	WAL     walDelta      // pg_stat_wal difference around the run; WAL.OK false when not read
	Mallocs uint64        // runtime.MemStats.Mallocs difference of this process (0 for child processes)
	Lat     []time.Duration
}

// rate is the run's messages per second.
func (s sample) rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Msgs) / s.Elapsed.Seconds()
}

// walDelta is what pg_stat_wal counted between two snapshots (Postgres 14
// and later; OK is false on older servers, printed n/a).
type walDelta struct {
	OK      bool
	Syncs   int64 // wal_sync: WAL files synced to disk (fsync/fdatasync calls)
	Records int64 // wal_records
	Bytes   int64 // wal_bytes
}

// result is one row of the report: the medians of its runs.
type result struct {
	ID, Name string
	Lanes    int     // lanes (idemq) or connections (roofline)
	Runs     []int64 // messages of each run
	Rate     float64 // median msgs/s
	// Per message, medians over the runs; NaN when not measured.
	WALSyncs, WALRecords, WALBytes float64
	Allocs                         float64 // client process, all goroutines (pgx and kafka-go included); NaN for child processes
	// Added latency per message, idemq minus the plain baseline at the same
	// lanes (medians of the per-run percentiles); HasLat false when the
	// workload has no baseline.
	HasLat   bool
	P50, P99 time.Duration
}

// summarize turns a row's runs (and the baseline runs, for latency; nil for
// none) into its result. Runs without WAL counts leave the WAL fields NaN.
func summarize(id, name string, lanes int, runs, plain []sample, allocs bool) result {
	r := result{ID: id, Name: name, Lanes: lanes, WALSyncs: math.NaN(), WALRecords: math.NaN(), WALBytes: math.NaN(), Allocs: math.NaN()}
	var rates, syncs, recs, bytes, mallocs []float64
	walOK := len(runs) > 0
	for _, s := range runs {
		r.Runs = append(r.Runs, s.Msgs)
		rates = append(rates, s.rate())
		walOK = walOK && s.WAL.OK
		n := float64(max(s.Msgs, 1))
		syncs = append(syncs, float64(s.WAL.Syncs)/n)
		recs = append(recs, float64(s.WAL.Records)/n)
		bytes = append(bytes, float64(s.WAL.Bytes)/n)
		mallocs = append(mallocs, float64(s.Mallocs)/n)
	}
	r.Rate = median(rates)
	if walOK {
		r.WALSyncs, r.WALRecords, r.WALBytes = median(syncs), median(recs), median(bytes)
	}
	if allocs && len(runs) > 0 {
		r.Allocs = median(mallocs)
	}
	if len(plain) > 0 && len(plain) == len(runs) {
		var p50, p99 []float64
		for i := range runs {
			if len(runs[i].Lat) == 0 || len(plain[i].Lat) == 0 {
				return r
			}
			p50 = append(p50, float64(percentile(runs[i].Lat, 50)-percentile(plain[i].Lat, 50)))
			p99 = append(p99, float64(percentile(runs[i].Lat, 99)-percentile(plain[i].Lat, 99)))
		}
		r.HasLat, r.P50, r.P99 = true, time.Duration(median(p50)), time.Duration(median(p99))
	}
	return r
}

// median of xs (the mean of the middle two for an even count); NaN when
// empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile p (0–100) of ds by the nearest-rank method; 0 when empty.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// ratio is a/b, NaN when either is unknown or b is 0.
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

// ---------------------------------------------------------------------------
// Parsing.

var (
	pgbenchTPS  = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)`)
	pgbenchTxns = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	pgbenchFail = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

// pgbenchResult is what parsePgbench reads from pgbench's summary.
type pgbenchResult struct {
	TPS  float64 // transactions per second, without the initial connection time
	Txns int64   // transactions processed
}

// parsePgbench reads pgbench's summary (PostgreSQL 13 to 17 formats). It
// fails when the tps or transaction count line is missing, or when pgbench
// counted failed transactions.
func parsePgbench(out string) (pgbenchResult, error) {
	m := pgbenchTPS.FindStringSubmatch(out)
	if m == nil {
		return pgbenchResult{}, errors.New("pgbench: no tps line in its output")
	}
	tps, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: tps %q: %w", m[1], err)
	}
	m = pgbenchTxns.FindStringSubmatch(out)
	if m == nil {
		return pgbenchResult{}, errors.New("pgbench: no transaction count in its output")
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: transactions %q: %w", m[1], err)
	}
	if m := pgbenchFail.FindStringSubmatch(out); m != nil && m[1] != "0" {
		return pgbenchResult{}, fmt.Errorf("pgbench: %s failed transactions", m[1])
	}
	return pgbenchResult{TPS: tps, Txns: n}, nil
}

// parseFsync reads the ops/sec of method (the server's wal_sync_method,
// e.g. "fdatasync") from pg_test_fsync's first section, "Compare file sync
// methods using one 8kB write".
func parseFsync(out, method string) (float64, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	in := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "Compare file sync methods using one"):
			in = true
		case strings.HasPrefix(line, "Compare file sync methods using two"):
			in = false
		case in:
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == method && f[2] == "ops/sec" {
				v, err := strconv.ParseFloat(f[1], 64)
				if err != nil {
					return 0, fmt.Errorf("pg_test_fsync: %s: %q: %w", method, f[1], err)
				}
				return v, nil
			}
		}
	}
	return 0, fmt.Errorf("pg_test_fsync: no %q line under \"one 8kB write\"", method)
}

// goBench is one line of `go test -bench -benchmem` output.
type goBench struct {
	Name        string // without the -GOMAXPROCS suffix
	NsPerOp     float64
	BytesPerOp  float64
	AllocsPerOp float64
}

var goBenchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([0-9.]+) ns/op(.*)$`)

// parseGoBench reads the benchmark lines of `go test -bench -benchmem`
// output; it fails when there is none.
func parseGoBench(out string) ([]goBench, error) {
	var res []goBench
	for _, line := range strings.Split(out, "\n") {
		m := goBenchLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		ns, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("go bench %s: ns/op %q: %w", m[1], m[2], err)
		}
		b := goBench{Name: m[1], NsPerOp: ns, BytesPerOp: math.NaN(), AllocsPerOp: math.NaN()}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "B/op":
				b.BytesPerOp = v
			case "allocs/op":
				b.AllocsPerOp = v
			}
		}
		res = append(res, b)
	}
	if len(res) == 0 {
		return nil, errors.New("go test -bench: no benchmark line in its output")
	}
	return res, nil
}

// ---------------------------------------------------------------------------
// The report.

// setupInfo is the report's setup line.
type setupInfo struct {
	Date        time.Time
	Cores       int
	CPU         string
	FsyncPerSec float64 // pg_test_fsync, the server's wal_sync_method, one 8kB write
	FsyncWhere  string  // the directory pg_test_fsync wrote in, and whether it is the data directory's filesystem
	PGVersion   string
	PGSettings  []string // name=setting of pg_settings where source <> 'default' (see pgSetup)
	Runs        int
	Duration    time.Duration // of each timed Postgres run
	Warmup      time.Duration
	KafkaMsgs   int // messages of each Kafka run
	RelayRows   int // rows of each relay run
	Note        string
}

// row is an idemq workload's result beside its roofline's.
type row struct {
	result
	Roofline     string // roofline ID
	RooflineName string
	RooflineRate float64
	Ratio        float64 // Rate / RooflineRate
}

// report is everything a run measured.
type report struct {
	Setup     setupInfo
	Rooflines []result
	Rows      []row
	F0        []goBench
	Targets   []targetResult
}

// lookup finds a roofline or idemq row by ID.
func (r *report) lookup(id string) (result, bool) {
	for _, x := range r.Rooflines {
		if x.ID == id {
			return x, true
		}
	}
	for _, x := range r.Rows {
		if x.ID == id {
			return x.result, true
		}
	}
	return result{}, false
}

// Target states.
const (
	targetMet         = "met"
	targetMissed      = "missed"
	targetNotMeasured = "not measured"
)

// target is one of the targets: Eval computes its state and the
// numbers behind it from the report.
type target struct {
	Text string
	Eval func(r *report) (state, detail string)
}

// targetResult is a target evaluated.
type targetResult struct {
	Text, State, Detail string
}

// evaluate computes every target against r.
func evaluate(r *report, ts []target) []targetResult {
	out := make([]targetResult, 0, len(ts))
	for _, t := range ts {
		s, d := t.Eval(r)
		out = append(out, targetResult{Text: t.Text, State: s, Detail: d})
	}
	return out
}

// atLeastRatio is a target "row ≥ want × of": met when every pair is.
func atLeastRatio(want float64, pairs ...[2]string) func(r *report) (string, string) {
	return func(r *report) (string, string) {
		state := targetMet
		var parts []string
		for _, p := range pairs {
			a, okA := r.lookup(p[0])
			b, okB := r.lookup(p[1])
			if !okA || !okB || math.IsNaN(ratio(a.Rate, b.Rate)) {
				return targetNotMeasured, fmt.Sprintf("%s or %s not measured", p[0], p[1])
			}
			q := ratio(a.Rate, b.Rate)
			if q < want {
				state = targetMissed
			}
			parts = append(parts, fmt.Sprintf("%s %s / %s %s = %.2f", p[0], fmtRate(a.Rate), p[1], fmtRate(b.Rate), q))
		}
		return state, strings.Join(parts, "; ")
	}
}

// atLeastRate is a target "row ≥ want msgs/s".
func atLeastRate(id string, want float64) func(r *report) (string, string) {
	return func(r *report) (string, string) {
		a, ok := r.lookup(id)
		if !ok {
			return targetNotMeasured, id + " not measured"
		}
		s := targetMet
		if a.Rate < want {
			s = targetMissed
		}
		return s, fmt.Sprintf("%s %s msgs/s", id, fmtRate(a.Rate))
	}
}

// walSyncsAtMost is a target "each row ≤ want WAL syncs per message"
// (0: none).
func walSyncsAtMost(want float64, ids ...string) func(r *report) (string, string) {
	return func(r *report) (string, string) {
		s := targetMet
		var parts []string
		for _, id := range ids {
			a, ok := r.lookup(id)
			if !ok || math.IsNaN(a.WALSyncs) {
				return targetNotMeasured, id + ": WAL syncs not measured (pg_stat_wal needs Postgres 14)"
			}
			if a.WALSyncs > want {
				s = targetMissed
			}
			parts = append(parts, fmt.Sprintf("%s %.3f syncs/msg", id, a.WALSyncs))
		}
		return s, strings.Join(parts, "; ")
	}
}

// msgsPerSyncAtLeast is a target "each row ≥ want messages per WAL sync".
func msgsPerSyncAtLeast(want float64, ids ...string) func(r *report) (string, string) {
	return func(r *report) (string, string) {
		s := targetMet
		var parts []string
		for _, id := range ids {
			a, ok := r.lookup(id)
			if !ok || math.IsNaN(a.WALSyncs) {
				return targetNotMeasured, id + ": WAL syncs not measured (pg_stat_wal needs Postgres 14)"
			}
			per := math.Inf(1)
			if a.WALSyncs > 0 {
				per = 1 / a.WALSyncs
			}
			if per < want {
				s = targetMissed
			}
			parts = append(parts, fmt.Sprintf("%s %.0f msgs/sync", id, per))
		}
		return s, strings.Join(parts, "; ")
	}
}

// both is met when every part is, missed when any is, and not measured
// when any is not (and none missed).
func both(fs ...func(r *report) (string, string)) func(r *report) (string, string) {
	return func(r *report) (string, string) {
		state := targetMet
		var parts []string
		for _, f := range fs {
			s, d := f(r)
			parts = append(parts, d)
			switch {
			case s == targetMissed:
				state = targetMissed
			case s == targetNotMeasured && state == targetMet:
				state = targetNotMeasured
			}
		}
		return state, strings.Join(parts, "; ")
	}
}

// ---------------------------------------------------------------------------
// Rendering.

func fmtRate(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return groupThousands(int64(math.Round(v)))
}

func groupThousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtFloat(v float64, prec int) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func fmtRuns(runs []int64) string {
	parts := make([]string, len(runs))
	for i, n := range runs {
		parts[i] = groupThousands(n)
	}
	return strings.Join(parts, " / ")
}

func fmtLat(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	if math.Abs(us) >= 1000 {
		return strconv.FormatFloat(us/1000, 'f', 2, 64) + " ms"
	}
	return strconv.FormatFloat(us, 'f', 0, 64) + " µs"
}

// idemqTable is the markdown table of the idemq rows.
func idemqTable(r *report) string {
	var b strings.Builder
	b.WriteString("| workload | lanes | N per run | msgs/s | roofline | roofline msgs/s | ratio | WAL syncs/msg | WAL records/msg | WAL B/msg | allocs/msg (client total incl. pgx) | added p50 | added p99 |\n")
	b.WriteString("|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, x := range r.Rows {
		p50, p99 := "n/a", "n/a"
		if x.HasLat {
			p50, p99 = fmtLat(x.P50), fmtLat(x.P99)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			x.Name, x.Lanes, fmtRuns(x.Runs), fmtRate(x.Rate), x.RooflineName, fmtRate(x.RooflineRate),
			fmtFloat(x.Ratio, 2), fmtFloat(x.WALSyncs, 3), fmtFloat(x.WALRecords, 1), fmtFloat(x.WALBytes, 0),
			fmtFloat(x.Allocs, 0), p50, p99)
	}
	return b.String()
}

// rooflineTable is the markdown table of the rooflines.
func rooflineTable(r *report) string {
	var b strings.Builder
	b.WriteString("| roofline | connections | N per run | msgs/s | WAL syncs/msg | WAL records/msg | WAL B/msg |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|\n")
	for _, x := range r.Rooflines {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", x.Name, x.Lanes, fmtRuns(x.Runs), fmtRate(x.Rate),
			fmtFloat(x.WALSyncs, 3), fmtFloat(x.WALRecords, 1), fmtFloat(x.WALBytes, 0))
	}
	return b.String()
}

// f0Table is the markdown table of `go test -bench F0 -benchmem ./consumer`.
func f0Table(r *report) string {
	var b strings.Builder
	b.WriteString("| benchmark | ns/msg | B/msg | allocs/msg |\n|---|--:|--:|--:|\n")
	for _, x := range r.F0 {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", x.Name, fmtFloat(x.NsPerOp, 0), fmtFloat(x.BytesPerOp, 0), fmtFloat(x.AllocsPerOp, 0))
	}
	return b.String()
}

// checklist is the targets as a markdown task list.
func checklist(r *report) string {
	var b strings.Builder
	for _, t := range r.Targets {
		box := " "
		if t.State == targetMet {
			box = "x"
		}
		fmt.Fprintf(&b, "- [%s] **%s**: %s (%s)\n", box, t.State, t.Text, t.Detail)
	}
	return b.String()
}

// setupLine is the one-line description of the machine and server.
func setupLine(s setupInfo) string {
	return fmt.Sprintf("%s; %d cores, %s; fsync %s/s (pg_test_fsync, one 8kB write, %s); PostgreSQL %s; settings not at their default: %s",
		s.Date.UTC().Format("2006-01-02 15:04 MST"), s.Cores, s.CPU, fmtRate(s.FsyncPerSec), s.FsyncWhere, s.PGVersion,
		strings.Join(s.PGSettings, ", "))
}

// methodLine states how the numbers were taken.
func methodLine(s setupInfo) string {
	return fmt.Sprintf("Each row is the median of %d interleaved runs (round by round, every roofline then every workload), "+
		"after one warm-up run of each (%s; pgbench at least 2s, a tenth of the messages for Kafka and the relay). "+
		"Postgres runs last %s each, the plain-transaction baselines of the latency a third of that (N is what each run did); "+
		"Kafka consumption runs read %s messages, relay runs move %s rows.",
		s.Runs, s.Warmup, s.Duration, groupThousands(int64(s.KafkaMsgs)), groupThousands(int64(s.RelayRows)))
}

// stdoutReport is what the program prints.
func stdoutReport(r *report) string {
	var b strings.Builder
	b.WriteString("setup: " + setupLine(r.Setup) + "\n" + methodLine(r.Setup) + "\n\n")
	b.WriteString("idemq against its rooflines\n\n" + idemqTable(r) + "\nrooflines\n\n" + rooflineTable(r))
	b.WriteString("\nidemq's own cost per message (go test -bench F0 -benchmem ./consumer)\n\n" + f0Table(r))
	b.WriteString("\ntargets\n\n" + checklist(r))
	return b.String()
}

// markdown renders docs/benchmarks.md; chart is the chart's file name,
// relative to the document.
func markdown(r *report, chart string) string {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("Written by `make bench` (integration/cmd/benchreport): one run measures the rooflines, what the same " +
		"Postgres and Kafka do with the same work and no idemq (pgbench with plain inserts of the same row shapes, " +
		"raw kafka-go), and the same workloads through idemq, and prints the ratios. Do not edit by hand: run " +
		"`make bench` on a quiet machine and commit the result.\n\n")
	b.WriteString("**Setup:** " + setupLine(r.Setup) + ".\n\n" + methodLine(r.Setup) + "\n\n")
	if r.Setup.Note != "" {
		b.WriteString(r.Setup.Note + "\n\n")
	}
	b.WriteString("![idemq beside its roofline, per workload](" + chart + ")\n\n")
	b.WriteString("## idemq against its rooflines\n\n" + idemqTable(r) + "\n")
	b.WriteString(columnsDoc + "\n")
	b.WriteString("## Rooflines\n\n" + rooflineTable(r) + "\n" + rooflinesDoc + "\n")
	b.WriteString("## idemq's own cost per message\n\n`go test -run '^$' -bench F0 -benchmem ./consumer`: the runtime and " +
		"the fingerprint with no database (consumer/f0_bench_test.go).\n\n" + f0Table(r) + "\n")
	b.WriteString("## Targets\n\nComputed from the numbers above; a missed target is reported, never a failure of `make bench`.\n\n" +
		checklist(r))
	return b.String()
}

const columnsDoc = `Columns: **ratio** is msgs/s over the roofline's msgs/s from the same run. **WAL syncs/msg**, **WAL records/msg**
and **WAL B/msg** are pg_stat_wal's wal_sync, wal_records and wal_bytes counted around each run, over its messages
(server-wide: other clients of the server count too; n/a before PostgreSQL 14). **allocs/msg** is
runtime.MemStats.Mallocs of the benchmark process over its messages: every goroutine, pgx, go-redis and kafka-go
included. **added p50/p99** is the per-message latency through idemq minus that of the same handler in a plain
transaction (begin, the handler's insert, commit; for duplicates, the record read alone) at the same lanes, from the
same round; in batched rows a message's latency is its batch's.
`

const rooflinesDoc = "Postgres rooflines are pgbench (`-n -M prepared`, custom scripts) on a scratch schema migrated by " +
	"idemq's own migrations, so that the records table has idemq's columns and indexes, plus the business table the " +
	"handler writes: per message, one record insert (`INSERT … ON CONFLICT DO NOTHING`, status SUCCEEDED) and one business " +
	"row; batched, 100 of those per transaction, one statement at a time or pipelined (`\\startpipeline`); duplicates, " +
	"the read of an existing record (one key per transaction, or 100 keys in one select). Kafka rooflines are kafka-go " +
	"alone: a consumer-group Reader committing every 100 messages, and a Writer (acks=all) writing the relay's batches.\n"
