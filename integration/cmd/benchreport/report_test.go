package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// pgbench 15's summary, as benchreport reads it.
const pgbench15 = `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: /tmp/benchreport-1.pgbench
scaling factor: 1
query mode: prepared
number of clients: 4
number of threads: 4
maximum number of tries: 1
duration: 3 s
number of transactions actually processed: 1234
number of failed transactions: 0 (0.000%)
latency average = 9.713 ms
initial connection time = 61.812 ms
tps = 411.806521 (without initial connection time)
`

// pgbench 13's summary words the tps line differently and has no failure count.
const pgbench13 = `transaction type: /tmp/x.pgbench
scaling factor: 1
query mode: prepared
number of clients: 1
number of threads: 1
duration: 2 s
number of transactions actually processed: 500
latency average = 4.000 ms
tps = 249.5 (including connections establishing)
tps = 250.000000 (excluding connections establishing)
`

func TestParsePgbench(t *testing.T) {
	for _, c := range []struct {
		name, out string
		tps       float64
		txns      int64
	}{{"pg15", pgbench15, 411.806521, 1234}, {"pg13", pgbench13, 250, 500}} {
		got, err := parsePgbench(c.out)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got.TPS != c.tps || got.Txns != c.txns {
			t.Errorf("%s: got %+v, want tps %v, %d transactions", c.name, got, c.tps, c.txns)
		}
	}
	for name, out := range map[string]string{
		"no tps":            strings.ReplaceAll(pgbench15, "tps =", "tp ="),
		"no count":          strings.ReplaceAll(pgbench15, "actually processed", "processed"),
		"failed":            strings.ReplaceAll(pgbench15, "failed transactions: 0", "failed transactions: 3"),
		"connections count": "tps = 12.0 (including connections establishing)\nnumber of transactions actually processed: 5\n",
	} {
		if got, err := parsePgbench(out); err == nil {
			t.Errorf("%s: parsed %+v, want an error", name, got)
		}
	}
}

const fsyncOut = `5 seconds per test
O_DIRECT supported on this platform for open_datasync and open_sync.

Compare file sync methods using one 8kB write:
(in wal_sync_method preference order, except fdatasync is Linux's default)
        open_datasync                      3085.280 ops/sec     324 usecs/op
        fdatasync                          3458.455 ops/sec     289 usecs/op
        fsync                              2216.197 ops/sec     451 usecs/op
        fsync_writethrough                              n/a
        open_sync                          2470.388 ops/sec     405 usecs/op

Compare file sync methods using two 8kB writes:
(in wal_sync_method preference order, except fdatasync is Linux's default)
        open_datasync                       761.068 ops/sec    1314 usecs/op
        fdatasync                          1672.809 ops/sec     598 usecs/op
`

func TestParseFsync(t *testing.T) {
	for method, want := range map[string]float64{"fdatasync": 3458.455, "fsync": 2216.197, "open_datasync": 3085.280} {
		got, err := parseFsync(fsyncOut, method)
		if err != nil || got != want {
			t.Errorf("%s: got %v, %v; want %v (the one-8kB-write section)", method, got, err, want)
		}
	}
	for _, method := range []string{"fsync_writethrough", "nosuch"} {
		if got, err := parseFsync(fsyncOut, method); err == nil {
			t.Errorf("%s: got %v, want an error", method, got)
		}
	}
	if got, err := parseFsync(fsyncOut[strings.Index(fsyncOut, "Compare file sync methods using two"):], "fdatasync"); err == nil {
		t.Errorf("two-write section only: got %v, want an error", got)
	}
}

func TestParseGoBench(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/idemq/idemq/consumer
cpu: AMD EPYC
BenchmarkF0/Handle-2         	  272590	      4222 ns/op	     160 B/op	       2 allocs/op
BenchmarkF0/FingerprintSum-2 	  731102	      1647.5 ns/op	      32 B/op	       1 allocs/op
PASS
ok  	github.com/idemq/idemq/consumer	3.1s
`
	got, err := parseGoBench(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []goBench{{"BenchmarkF0/Handle", 4222, 160, 2}, {"BenchmarkF0/FingerprintSum", 1647.5, 32, 1}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := parseGoBench("PASS\nok\n"); err == nil {
		t.Error("no benchmark line: want an error")
	}
}

func TestMedianPercentile(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing is not NaN")
	}
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(ds, 50); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(ds, 99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile(ds[:1], 99); p != 100*time.Millisecond {
		t.Errorf("p99 of one = %v", p)
	}
}

func TestSummarize(t *testing.T) {
	lat := func(ms ...int) []time.Duration {
		var out []time.Duration
		for _, m := range ms {
			out = append(out, time.Duration(m)*time.Millisecond)
		}
		return out
	}
	runs := []sample{
		{Msgs: 1000, Elapsed: time.Second, WAL: walDelta{OK: true, Syncs: 10, Records: 4000, Bytes: 400000}, Mallocs: 50000, Lat: lat(3, 4, 5)},
		{Msgs: 3000, Elapsed: time.Second, WAL: walDelta{OK: true, Syncs: 60, Records: 9000, Bytes: 900000}, Mallocs: 90000, Lat: lat(5, 6, 7)},
		{Msgs: 2000, Elapsed: time.Second, WAL: walDelta{OK: true, Syncs: 20, Records: 8000, Bytes: 800000}, Mallocs: 80000, Lat: lat(4, 5, 6)},
	}
	plain := []sample{{Lat: lat(1, 1, 1)}, {Lat: lat(1, 1, 1)}, {Lat: lat(1, 1, 1)}}
	r := summarize("x", "x", 1, runs, plain, true)
	if r.Rate != 2000 || r.WALSyncs != 0.01 || r.WALRecords != 4 || r.WALBytes != 400 || r.Allocs != 40 {
		t.Errorf("got %+v, want rate 2000, 0.01 syncs, 4 records, 400 B, 40 allocs per message", r)
	}
	if !r.HasLat || r.P50 != 4*time.Millisecond || r.P99 != 5*time.Millisecond {
		t.Errorf("added latency %v %v %v, want p50 4ms, p99 5ms", r.HasLat, r.P50, r.P99)
	}
	runs[1].WAL.OK = false // Postgres 13: no pg_stat_wal
	r = summarize("x", "x", 1, runs, nil, false)
	if !math.IsNaN(r.WALSyncs) || !math.IsNaN(r.Allocs) || r.HasLat {
		t.Errorf("got %+v, want WAL and allocations n/a, no latency", r)
	}
}

func testReport() *report {
	return &report{
		Setup: setupInfo{Date: time.Date(2026, 11, 30, 20, 0, 0, 0, time.UTC), Cores: 2, CPU: "AMD EPYC", FsyncPerSec: 3458.4,
			FsyncWhere: "fdatasync", PGVersion: "15.18", PGSettings: []string{"fsync=on"}, Runs: 3, Duration: 3 * time.Second,
			Warmup: time.Second, KafkaMsgs: 10000, RelayRows: 10000},
		Rooflines: []result{
			{ID: "pg-tx-1", Name: "pgbench per-message", Lanes: 1, Rate: 2000, Runs: []int64{6000, 6100, 5900}, WALSyncs: 1, WALRecords: 4, WALBytes: 500},
			{ID: "pg-dup-1", Name: "pgbench dup", Lanes: 1, Rate: 20000, WALSyncs: 0, WALRecords: 0, WALBytes: 0},
			{ID: "pg-batch100-1", Name: "pgbench batched", Lanes: 1, Rate: 7000, WALSyncs: 0.01},
		},
		Rows: []row{
			{result: result{ID: "per-message-1", Name: "per-message", Lanes: 1, Rate: 1700, Runs: []int64{5100, 5000, 5200},
				WALSyncs: 1, WALRecords: 5, WALBytes: 600, Allocs: 98, HasLat: true, P50: 120 * time.Microsecond, P99: 2500 * time.Microsecond},
				Roofline: "pg-tx-1", RooflineName: "pgbench per-message, 1 conn.", RooflineRate: 2000, Ratio: 0.85},
			{result: result{ID: "dup-pg-1", Name: "duplicates", Lanes: 1, Rate: 15000, WALSyncs: 0.002, WALRecords: math.NaN(), WALBytes: math.NaN(), Allocs: math.NaN()},
				Roofline: "pg-dup-1", RooflineRate: 20000, Ratio: 0.75},
			{result: result{ID: "batched-1", Name: "batched", Lanes: 1, Rate: 5000, WALSyncs: 0.008}, Roofline: "pg-batch100-1", RooflineRate: 7000},
		},
		F0: []goBench{{"BenchmarkF0/Handle", 812, 160, 2}},
	}
}

func TestTargets(t *testing.T) {
	r := testReport()
	got := evaluate(r, []target{
		{Text: "per-message", Eval: atLeastRatio(0.8, [2]string{"per-message-1", "pg-tx-1"})},
		{Text: "per-message strict", Eval: atLeastRatio(0.9, [2]string{"per-message-1", "pg-tx-1"})},
		{Text: "dups", Eval: both(atLeastRatio(0.7, [2]string{"dup-pg-1", "pg-dup-1"}), walSyncsAtMost(0, "dup-pg-1"))},
		{Text: "set", Eval: both(atLeastRatio(0.85, [2]string{"batch-set-4", "pg-pipe100-4"}), atLeastRate("batch-set-4", 50000))},
		{Text: "rate", Eval: atLeastRate("dup-pg-1", 10000)},
		{Text: "per sync", Eval: msgsPerSyncAtLeast(100, "batched-1")},
		{Text: "per sync strict", Eval: msgsPerSyncAtLeast(200, "batched-1")},
	})
	want := []string{targetMet, targetMissed, targetMissed, targetNotMeasured, targetMet, targetMet, targetMissed}
	for i, w := range want {
		if got[i].State != w {
			t.Errorf("%s: %s (%s), want %s", got[i].Text, got[i].State, got[i].Detail, w)
		}
	}
	if d := got[0].Detail; d != "per-message-1 1,700 / pg-tx-1 2,000 = 0.85" {
		t.Errorf("detail %q", d)
	}
	if d := got[5].Detail; d != "batched-1 125 msgs/sync" {
		t.Errorf("detail %q", d)
	}
	// The targets name rows and rooflines that exist.
	ids := map[string]bool{}
	for _, w := range workloads {
		ids[w.ID] = true
		ids[w.Roofline] = true
	}
	for _, rf := range rooflines {
		ids[rf.ID] = true
	}
	full := &report{}
	for id := range ids {
		full.Rooflines = append(full.Rooflines, result{ID: id, Rate: 1})
	}
	for _, tr := range evaluate(full, targets) {
		if strings.Contains(tr.Detail, "not measured") {
			t.Errorf("target %q names a row that is not in the tables: %s", tr.Text, tr.Detail)
		}
	}
	for _, w := range workloads {
		if _, ok := full.lookup(w.Roofline); !ok {
			t.Errorf("workload %s: no roofline %q", w.ID, w.Roofline)
		}
	}
}

func TestMarkdown(t *testing.T) {
	r := testReport()
	r.Targets = evaluate(r, []target{{Text: "per-message ≥ 0.8", Eval: atLeastRatio(0.8, [2]string{"per-message-1", "pg-tx-1"})}})
	md := markdown(r, "benchmarks.svg")
	for _, want := range []string{
		"# Benchmarks\n",
		"**Setup:** 2026-11-30 20:00 UTC; 2 cores, AMD EPYC; fsync 3,458/s (pg_test_fsync, one 8kB write, fdatasync); PostgreSQL 15.18; settings not at their default: fsync=on.",
		"![idemq beside its roofline, per workload](benchmarks.svg)",
		"| per-message | 1 | 5,100 / 5,000 / 5,200 | 1,700 | pgbench per-message, 1 conn. | 2,000 | 0.85 | 1.000 | 5.0 | 600 | 98 | 120 µs | 2.50 ms |\n",
		"| duplicates | 1 |  | 15,000 |  | 20,000 | 0.75 | 0.002 | n/a | n/a | n/a | n/a | n/a |\n",
		"| pgbench per-message | 1 | 6,000 / 6,100 / 5,900 | 2,000 | 1.000 | 4.0 | 500 |\n",
		"| BenchmarkF0/Handle | 812 | 160 | 2 |\n",
		"- [x] **met**: per-message ≥ 0.8 (per-message-1 1,700 / pg-tx-1 2,000 = 0.85)\n",
		"median of 3 interleaved runs",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "```go") {
		t.Error("markdown holds a Go block (internal/docscheck wants each in an example test)")
	}
	if out := stdoutReport(r); !strings.Contains(out, "| per-message | 1 |") || !strings.Contains(out, "[x] **met**") {
		t.Errorf("stdout report lacks the table or the checklist:\n%s", out)
	}
}

func TestGroupThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		if got := groupThousands(n); got != want {
			t.Errorf("%d: %q, want %q", n, got, want)
		}
	}
}

func TestWithAppName(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u@h:5432/db?sslmode=disable": "postgres://u@h:5432/db?sslmode=disable&application_name=x",
		"postgresql://u@h/db":                    "postgresql://u@h/db?application_name=x",
		"host=h dbname=db":                       "host=h dbname=db application_name=x",
	} {
		if got := withAppName(dsn, "x"); got != want {
			t.Errorf("%s: %q, want %q", dsn, got, want)
		}
	}
}
