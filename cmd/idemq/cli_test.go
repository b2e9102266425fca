package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/spf13/cobra"
)

// A DSN that is never reached: 127.0.0.1:1 refuses connections, so a
// command that connects fails with exit 1, not 2.
const (
	testPassword = "s3cretPW"
	testDSN      = "postgres://ops:" + testPassword + "@127.0.0.1:1/idemq?connect_timeout=2"
)

// result is one in-process run of the CLI.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the cobra root in-process with args and env; store, when not
// nil, is what the dead-letter verbs open instead of a real store.
func cli(t *testing.T, env map[string]string, store any, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	a := &app{stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] }}
	a.openDeadLetters = a.openStoreAny
	if store != nil {
		a.openDeadLetters = func(context.Context, *storeFlags) (any, func(), error) { return store, func() {}, nil }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := a.execute(ctx, args)
	return result{out.String(), errb.String(), code}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// allCommands walks the command tree.
func allCommands(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, s := range c.Commands() {
		out = append(out, allCommands(s)...)
	}
	return out
}

// Every command has real help: -h and --help exit 0 with the usage on
// stdout, and the help never shows the DSN or Redis URL of the
// environment (nor any default DSN).
func TestHelpEveryCommand(t *testing.T) {
	env := map[string]string{"IDEMQ_DATABASE_URL": testDSN, "IDEMQ_REDIS_URL": "redis://:" + testPassword + "@127.0.0.1:1/0"}
	a := &app{}
	cmds := allCommands(a.rootCommand())
	if len(cmds) < 18 {
		t.Fatalf("%d commands, want every verb", len(cmds))
	}
	for _, c := range cmds {
		path := strings.Fields(c.CommandPath())[1:]
		for _, h := range []string{"-h", "--help"} {
			r := cli(t, env, nil, append(path, h)...)
			want := c.Short
			if c.Long != "" {
				want, _, _ = strings.Cut(c.Long, "\n")
			}
			if r.code != exitOK || !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, want) {
				t.Fatalf("idemq %v %s: %v", path, h, r)
			}
			if strings.Contains(r.stdout+r.stderr, testPassword) || strings.Contains(r.stdout, "postgres://idemq") || strings.Contains(r.stdout, "127.0.0.1:5432") {
				t.Fatalf("idemq %v %s shows a DSN:\n%s", path, h, r.stdout)
			}
		}
		if c.Flags().Lookup("dsn") != nil && !strings.Contains(cli(t, nil, nil, append(path, "--help")...).stdout, "IDEMQ_DATABASE_URL") {
			t.Fatalf("idemq %v --help does not name IDEMQ_DATABASE_URL", path)
		}
	}
	// migrate does not advertise --redis, which it cannot use.
	if r := cli(t, nil, nil, "migrate", "--help"); strings.Contains(r.stdout, "--redis") {
		t.Fatalf("migrate --help advertises --redis:\n%s", r.stdout)
	}
}

// panicStore fails a test that reaches the store: usage errors are found
// before any work.
type panicStore struct{}

// Usage errors exit 2, name what is wrong, and are found before any
// connection (the DSN points at a closed port: connecting would exit 1).
func TestUsageErrorsExit2(t *testing.T) {
	dsn := []string{"--dsn", testDSN}
	kafka := append([]string{"relay", "--kafka-brokers", "127.0.0.1:1"}, dsn...)
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, nil, "give a command"},
		{nil, []string{"nope"}, `unknown command "nope"`},
		{nil, []string{"outbox"}, "give a command"},
		{nil, []string{"outbox", "nope"}, `unknown command "nope" for "idemq outbox"`},
		{nil, []string{"dead-letters"}, "give a command"},
		{nil, []string{"migrate", "--bogus"}, "unknown flag: --bogus"},
		{nil, []string{"migrate", "-dsn", testDSN}, "long flags take two dashes: --dsn"},
		{nil, []string{"relay", "-once"}, "long flags take two dashes: --once"},
		{nil, []string{"inspect", "-scope=x"}, "long flags take two dashes: --scope=x"},
		{nil, []string{"migrate"}, "pass --dsn or set IDEMQ_DATABASE_URL"},
		{nil, []string{"outbox", "stats"}, "pass --dsn or set IDEMQ_DATABASE_URL"},
		{nil, []string{"dead-letters", "list", "--scope", "s"}, "pass --dsn or set IDEMQ_DATABASE_URL"},
		{map[string]string{"TEST_POSTGRES_DSN": testDSN}, []string{"migrate"}, "pass --dsn or set IDEMQ_DATABASE_URL"},
		{nil, []string{"migrate", "--dsn", "postgres://u:p@h:notaport/db"}, "--dsn:"},
		{nil, append([]string{"migrate", "--print", "--check"}, dsn...), "none of the others can be"},
		{nil, append([]string{"migrate", "extra"}, dsn...), "takes no arguments"},
		{nil, append([]string{"migrate", "-o", "yaml"}, dsn...), `want table or json, got "yaml"`},
		{nil, append([]string{"purge", "--batch", "0"}, dsn...), "--batch 0 must be 1 to 100000"},
		{nil, append([]string{"purge", "--batch", "many"}, dsn...), `invalid argument "many"`},
		{nil, append([]string{"purge", "--older-than", "48h"}, dsn...), "--older-than is for --dead-letters"},
		{nil, append([]string{"purge", "--dead-letters", "--older-than", "30s"}, dsn...), "at least 1m"},
		{nil, append([]string{"purge", "--redis", "redis://x"}, dsn...), "unknown flag: --redis"},
		{nil, append([]string{"inspect", "--scope", "s"}, dsn...), "exactly one of --message-id and --business-key"},
		{nil, append([]string{"inspect", "--message-id", "m"}, dsn...), "--scope is required"},
		{nil, append([]string{"inspect", "--scope", "s", "--message-id", "m", "--redis", "redis://127.0.0.1:1/0"}, dsn...), "give --dsn or --redis, not both"},
		{map[string]string{"IDEMQ_DATABASE_URL": testDSN, "IDEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}, []string{"inspect", "--scope", "s", "--message-id", "m"}, "pass --dsn or --redis to choose"},
		{nil, []string{"inspect", "--scope", "s", "--message-id", "m", "--redis", "http://x"}, "--redis:"},
		{nil, append([]string{"redrive", "--scope", "s"}, dsn...), "--message-id is required"},
		{nil, append([]string{"redrive", "--as-new", "--scope", "s"}, dsn...), "--id of the dead letter is required"},
		{nil, append([]string{"redrive", "--as-new", "--scope", "s", "--id", "3"}, dsn...), "--kafka-brokers (or IDEMQ_KAFKA_BROKERS) is required"},
		{nil, append([]string{"redrive", "--as-new", "--scope", "s", "--id", "3", "--broker", "rocketmq"}, dsn...), "--rocketmq-namesrv (or IDEMQ_ROCKETMQ_NAMESRV) is required"},
		{nil, append([]string{"relay"}, dsn...), "--kafka-brokers (or IDEMQ_KAFKA_BROKERS) is required"},
		{nil, append(kafka, "--broker", "nats"), `--broker "nats": want kafka or rocketmq`},
		{nil, append(kafka, "--batch-size", "20000"), "--batch-size 20000 must be 1 to 10000"},
		{nil, append(kafka, "--batch-size", "10", "--max-keys", "20"), "--max-keys 20 must be 1 to --batch-size (10)"},
		{nil, append(kafka, "--poll-interval", "1ms"), "--poll-interval 1ms must be 10ms to 1h"},
		{nil, append(kafka, "--no-purge", "--retention", "1h"), "--retention is not for --no-purge"},
		{nil, append(kafka, "--metrics-addr", "nocolon"), `--metrics-addr "nocolon"`},
		{nil, append(kafka, "--once", "--metrics-addr", ":0"), "--metrics-addr is not for --once"},
		{nil, append(kafka, "--log-format", "xml"), `--log-format "xml": want text or json`},
		{nil, append(kafka, "-o", "json"), "--output is for --once"},
		{map[string]string{"IDEMQ_LOG_FORMAT": "xml"}, kafka, `--log-format "xml"`},
		{nil, append([]string{"outbox", "unpark"}, dsn...), "say which rows: --all, --topic T, --key K"},
		{nil, append([]string{"outbox", "unpark", "--all", "--topic", "t"}, dsn...), "not with --topic, --key or IDs"},
		{nil, append([]string{"outbox", "unpark", "--key", "k", "0191f5b4-6c1e-7c4e-9d1a-3b2f0e8a9c11"}, dsn...), "not both"},
		{nil, append([]string{"outbox", "unpark", "not-a-uuid"}, dsn...), `ID "not-a-uuid"`},
		{nil, append([]string{"outbox", "parked", "--limit", "0"}, dsn...), "--limit 0 must be 1 to 10000"},
		{nil, append([]string{"outbox", "purge", "--batch", "0"}, dsn...), "--batch 0 must be 1 to 100000"},
		{nil, append([]string{"outbox", "purge", "--older-than", "-1h"}, dsn...), "must not be negative"},
		{nil, append([]string{"outbox", "stats", "--table", ""}, dsn...), "--table must not be empty"},
		{nil, append([]string{"outbox", "migrate", "--schema", ""}, dsn...), "--schema must not be empty"},
	} {
		r := cli(t, c.env, panicStore{}, c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "--help' for usage") || r.stdout != "" {
			t.Errorf("idemq %q: want exit 2 with %q\n%v", c.args, c.want, r)
		}
		if strings.Contains(r.stderr, testPassword) {
			t.Errorf("idemq %q: the password is in the error:\n%s", c.args, r.stderr)
		}
	}
}

// A runtime failure (here: the database refuses connections) exits 1,
// and the error never shows the DSN's password.
func TestRuntimeErrorExit1Redacted(t *testing.T) {
	for _, args := range [][]string{
		{"migrate", "--check"},
		{"inspect", "--scope", "s", "--message-id", "m"},
		{"outbox", "stats"},
		{"outbox", "purge"},
		{"purge"},
	} {
		r := cli(t, map[string]string{"IDEMQ_DATABASE_URL": testDSN}, nil, args...)
		if r.code != exitRuntime || !strings.HasPrefix(r.stderr, "idemq") || strings.Contains(r.stderr, "--help") {
			t.Errorf("idemq %q: want exit 1\n%v", args, r)
		}
		if strings.Contains(r.stderr+r.stdout, testPassword) {
			t.Errorf("idemq %q: the password is in the output:\n%v", args, r)
		}
	}
	// A DSN pgx cannot parse: a usage error, password redacted.
	r := cli(t, nil, nil, "migrate", "--dsn", "postgres://ops:"+testPassword+"@127.0.0.1:99999/x")
	if r.code != exitUsage || strings.Contains(r.stderr, testPassword) {
		t.Fatalf("malformed DSN: %v", r)
	}
}

func TestRedactedDSN(t *testing.T) {
	a := &app{}
	cfg, err := a.poolConfig(&dbFlags{dsn: testDSN, schema: "idemq"})
	if err != nil {
		t.Fatal(err)
	}
	if got := redactedDSN(cfg); got != "postgres://ops:xxxxx@127.0.0.1:1/idemq" { //nolint:gosec // the redacted form, no credential
		t.Fatalf("redactedDSN = %q", got)
	}
	if got := a.redact("failed: " + testDSN); strings.Contains(got, testPassword) {
		t.Fatalf("redact left the password: %q", got)
	}
	cfg, _ = a.poolConfig(&dbFlags{dsn: "host=db user=ro password=" + testPassword + " dbname=x", schema: "idemq"})
	if got := redactedDSN(cfg); strings.Contains(got, testPassword) || !strings.Contains(got, "ro:xxxxx@db:5432/x") {
		t.Fatalf("redactedDSN of key=value = %q", got)
	}
}

func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"24h":                  now.Add(-24 * time.Hour),
		"90m":                  now.Add(-90 * time.Minute),
		"2026-11-30T08:00:00Z": time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC),
	} {
		got, err := parseWhen("since", in, now)
		if err != nil || !got.Equal(want) {
			t.Fatalf("parseWhen(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"yesterday", "-5h", "2026-11-30"} {
		if _, err := parseWhen("since", bad, now); err == nil || !isUsage(err) || !strings.Contains(err.Error(), "--since") {
			t.Fatalf("parseWhen(%q): %v, want a usage error naming --since", bad, err)
		}
	}
}

func TestFlagNamed(t *testing.T) {
	got := flagNamed("idemq/outbox: invalid config: MaxKeys 20 must be 1 to BatchSize (10); FallbackPollInterval 5s must be 10ms to PollInterval (1s)")
	want := "idemq/outbox: invalid config: --max-keys 20 must be 1 to --batch-size (10); --fallback-poll-interval 5s must be 10ms to --poll-interval (1s)"
	if got != want {
		t.Fatalf("flagNamed:\n got %s\nwant %s", got, want)
	}
}

// fakeDL is a store implementing the dead-letter contract, recording the
// calls.
type fakeDL struct {
	dls        []dedup.DeadLetter
	scans      []DeadLetterFilter
	counted    []DeadLetterFilter
	redrive    []RedriveOptions
	redriveF   []DeadLetterFilter
	summary    RedriveSummary
	redriveErr error
	republish  []RepublishOptions
	repResult  RepublishResult
	purged     []pgstore.PurgeOptions
	purgeN     int64
}

func (f *fakeDL) DeadLetter(_ context.Context, id int64) (dedup.DeadLetter, error) {
	for _, d := range f.dls {
		if d.ID == id {
			return d, nil
		}
	}
	return dedup.DeadLetter{}, dedup.ErrNotFound
}

func (f *fakeDL) ScanDeadLetters(_ context.Context, flt DeadLetterFilter) ([]dedup.DeadLetter, error) {
	f.scans = append(f.scans, flt)
	limit := flt.Limit
	if limit == 0 {
		limit = 100
	}
	var out []dedup.DeadLetter
	for _, d := range f.dls {
		if d.ID > flt.AfterID && (flt.Scope == "" || d.Scope == flt.Scope) && (flt.Reason == "" || d.Reason == flt.Reason) && len(out) < limit {
			out = append(out, d)
		}
	}
	return out, nil
}

func (f *fakeDL) CountDeadLetters(_ context.Context, flt DeadLetterFilter) (int64, error) {
	f.counted = append(f.counted, flt)
	return int64(len(f.dls)), nil
}

func (f *fakeDL) RedriveDeadLetters(_ context.Context, flt DeadLetterFilter, o RedriveOptions) (RedriveSummary, error) {
	f.redriveF = append(f.redriveF, flt)
	f.redrive = append(f.redrive, o)
	if o.Progress != nil {
		o.Progress(f.summary.Matched/2, f.summary.Matched)
		o.Progress(f.summary.Matched, f.summary.Matched)
	}
	s := f.summary
	if o.DryRun { // as the stores: a dry run releases nothing
		s.Redriven = 0
	}
	return s, f.redriveErr
}

func (f *fakeDL) RepublishDeadLetter(_ context.Context, _ int64, o RepublishOptions) (RepublishResult, error) {
	f.republish = append(f.republish, o)
	return f.repResult, nil
}

func (f *fakeDL) PurgeDeadLetters(_ context.Context, o pgstore.PurgeOptions) (int64, error) {
	f.purged = append(f.purged, o)
	if o.Progress != nil {
		o.Progress(f.purgeN)
	}
	return f.purgeN, nil
}

// fakeRedisDL is the Redis-only store's side: PurgeDeadLetters by age.
type fakeRedisDL struct {
	fakeDL
	olderThan time.Duration
}

func (f *fakeRedisDL) PurgeDeadLetters(_ context.Context, olderThan time.Duration) (int64, error) {
	f.olderThan = olderThan
	return 7, nil
}

var (
	_ deadLetterStore       = (*fakeDL)(nil)
	_ deadLetterRepublisher = (*fakeDL)(nil)
	_ pgDeadLetterPurger    = (*fakeDL)(nil)
	_ redisDeadLetterPurger = (*fakeRedisDL)(nil)
)

func sampleDLs(n int) []dedup.DeadLetter {
	created := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	out := make([]dedup.DeadLetter, n)
	for i := range out {
		out[i] = dedup.DeadLetter{ID: int64(i + 1), Scope: "payments", MessageID: fmt.Sprintf("m-%d", i+1), BusinessKey: fmt.Sprintf("pay-%d", i+1),
			Reason: dedup.ReasonPermanentError, Error: "card declined\n(issuer said no)", ErrorClass: "permanent", Attempts: 3,
			Topic: "payments", Key: []byte("acct-1"), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i+1)),
			Headers: map[string]string{"traceparent": "00-a-b-01", "x-idemq-message-id": fmt.Sprintf("m-%d", i+1)}, Source: "payments/0@" + fmt.Sprint(i), CreatedAt: created}
	}
	return out
}

var dsnArgs = []string{"--dsn", testDSN}

func TestDeadLettersList(t *testing.T) {
	f := &fakeDL{dls: sampleDLs(3)}
	redrivenAt := time.Now()
	f.dls[1].RedrivenAt = &redrivenAt
	f.dls[2].RedrivenAs = "m-3#redrive-3"
	r := cli(t, nil, f, append([]string{"dead-letters", "list", "--scope", "payments", "--reason", "permanent_error", "--since", "24h",
		"--until", "2030-01-01T00:00:00Z", "--redriven", "false", "--after-id", "0", "--limit", "50"}, dsnArgs...)...)
	if r.code != exitOK {
		t.Fatal(r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || strings.Contains(lines[0], "SCOPE") ||
		!strings.Contains(lines[1], "m-1") || !strings.Contains(lines[1], "card declined (issuer said no)") || !strings.Contains(lines[1], "2026-12-01T09:30:00Z") ||
		!strings.Contains(lines[2], "true") || !strings.Contains(lines[3], "as m-3#redrive-3") {
		t.Fatalf("table:\n%s", r.stdout)
	}
	got := f.scans[0]
	if got.Scope != "payments" || got.Reason != "permanent_error" || got.Limit != 50 || got.Redriven == nil || *got.Redriven ||
		time.Since(got.Since) < 24*time.Hour-time.Minute || time.Since(got.Since) > 24*time.Hour+time.Minute || got.Until.Year() != 2030 {
		t.Fatalf("filter = %+v", got)
	}

	r = cli(t, nil, f, append([]string{"dead-letters", "list", "--scope-prefix", "pay", "-o", "json"}, dsnArgs...)...)
	var js []map[string]any
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &js) != nil || len(js) != 3 {
		t.Fatalf("json: %v", r)
	}
	if js[0]["message_id"] != "m-1" || js[0]["scope"] != "payments" || js[0]["payload_bytes"] != float64(7) || js[0]["payload"] != nil ||
		js[0]["key"] != base64.StdEncoding.EncodeToString([]byte("acct-1")) || js[1]["redriven_at"] == nil || js[2]["redriven_as"] != "m-3#redrive-3" {
		t.Fatalf("json rows: %v", js)
	}
	if f.scans[1].ScopePrefix != "pay" || f.scans[1].Scope != "" {
		t.Fatalf("filter = %+v", f.scans[1])
	}
	// An empty list is an empty JSON array, not null.
	r = cli(t, nil, &fakeDL{}, append([]string{"dead-letters", "list", "-o", "json"}, dsnArgs...)...)
	if r.code != exitOK || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("empty json: %v", r)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "0"}, "--limit 0 must be 1 to 10000"},
		{[]string{"--limit", "10001"}, "--limit 10001"},
		{[]string{"--since", "yesterday"}, `--since "yesterday"`},
		{[]string{"--since", "1h", "--until", "2h"}, "is before --since"},
		{[]string{"--redriven", "maybe"}, `--redriven "maybe": want true or false`},
		{[]string{"--reason", "bored"}, `--reason "bored": want one of`},
		{[]string{"--after-id", "-1"}, "--after-id -1 must not be negative"},
		{[]string{"--scope", "a", "--scope-prefix", "b"}, "not both"},
		{[]string{"--scope-prefix", "b", "--redis", "redis://127.0.0.1:1/0", "--dsn", ""}, "--scope-prefix is Postgres only"},
		{[]string{"extra"}, "takes no arguments"},
	} {
		r := cli(t, nil, f, append(append([]string{"dead-letters", "list"}, dsnArgs...), c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("list %v: want exit 2 with %q\n%v", c.args, c.want, r)
		}
	}
}

// legacyDL has only the older per-scope listing (a store built before the
// dead-letter tooling).
type legacyDL struct{ dls []dedup.DeadLetter }

func (l legacyDL) DeadLetters(context.Context, string, int64, int) ([]dedup.DeadLetter, error) {
	return l.dls, nil
}

func TestDeadLettersListLegacyStore(t *testing.T) {
	st := legacyDL{dls: sampleDLs(2)}
	if r := cli(t, nil, st, append([]string{"dead-letters", "list", "--scope", "payments"}, dsnArgs...)...); r.code != 0 || !strings.Contains(r.stdout, "m-2") {
		t.Fatal(r)
	}
	for _, verb := range [][]string{{"list", "--scope", "payments", "--reason", "permanent_error"}, {"show", "1"}, {"export"}, {"redrive", "--all"}, {"republish", "1"}, {"purge", "--older-than", "1h"}} {
		r := cli(t, nil, st, append(append([]string{"dead-letters"}, verb...), dsnArgs...)...)
		if r.code != exitRuntime || !strings.Contains(r.stderr, "this store has no") {
			t.Errorf("%v on a store without the tooling: %v", verb, r)
		}
	}
}

func TestDeadLettersShow(t *testing.T) {
	f := &fakeDL{dls: sampleDLs(2)}
	f.dls[1].Payload = []byte{0xff, 0x00, 0x10}
	r := cli(t, nil, f, append([]string{"dead-letters", "show", "1"}, dsnArgs...)...)
	for _, want := range []string{"MESSAGE ID", "m-1", "REASON", "permanent_error", "ERROR CLASS", "permanent", "ATTEMPTS", "3",
		"HEADER traceparent", "00-a-b-01", "SOURCE", "payments/0@0", "CREATED", "2026-12-01T09:30:00Z", "PAYLOAD", "7 bytes, auto", `{"n":1}`} {
		if r.code != exitOK || !strings.Contains(r.stdout, want) {
			t.Fatalf("show: no %q\n%v", want, r)
		}
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "show", "1", "--decode", "json"}, dsnArgs...)...); r.code != 0 || !strings.Contains(r.stdout, "{\n  \"n\": 1\n}") {
		t.Fatalf("show --decode json: %v", r)
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "show", "2", "--decode", "hex"}, dsnArgs...)...); r.code != 0 || !strings.Contains(r.stdout, "ff0010") {
		t.Fatalf("show --decode hex: %v", r)
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "show", "2"}, dsnArgs...)...); r.code != 0 || !strings.Contains(r.stdout, "/wAQ") {
		t.Fatalf("show of a binary payload (auto: base64): %v", r)
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "show", "2", "--decode", "json"}, dsnArgs...)...); r.code != exitRuntime || !strings.Contains(r.stderr, "not JSON") {
		t.Fatalf("show --decode json of binary: %v", r)
	}
	r = cli(t, nil, f, append([]string{"dead-letters", "show", "1", "--decode-cmd", "tr a-z A-Z", "-o", "json"}, dsnArgs...)...)
	var js showJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &js) != nil || js.Decoded != `{"N":1}` || js.Decoding != "cmd" ||
		string(js.Payload) != `{"n":1}` || js.Headers["traceparent"] != "00-a-b-01" || js.Attempts != 3 || js.ErrorClass != "permanent" {
		t.Fatalf("show --decode-cmd -o json: %v\n%+v", r, js)
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "show", "1", "--decode-cmd", "exit 3"}, dsnArgs...)...); r.code != exitRuntime || !strings.Contains(r.stderr, "--decode-cmd") {
		t.Fatalf("failing --decode-cmd: %v", r)
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "show", "99"}, dsnArgs...)...); r.code != exitNotFound || !strings.Contains(r.stderr, "dead letter 99") || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("show of a missing one (exit 3, not a failure of the work): %v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "want 1 argument(s)"},
		{[]string{"1", "2"}, "want 1 argument(s)"},
		{[]string{"abc"}, `ID "abc": want a positive integer`},
		{[]string{"0"}, `ID "0"`},
		{[]string{"1", "--decode", "rot13"}, `--decode "rot13"`},
		{[]string{"1", "--decode", "hex", "--decode-cmd", "cat"}, "not both"},
	} {
		r := cli(t, nil, f, append(append([]string{"dead-letters", "show"}, c.args...), dsnArgs...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("show %v: want exit 2 with %q\n%v", c.args, c.want, r)
		}
	}
}

// export streams JSON Lines page by page: every dead letter once, in ID
// order, payload base64, with bounded pages (--page) and the cursor moved.
func TestDeadLettersExport(t *testing.T) {
	f := &fakeDL{dls: sampleDLs(2500)}
	r := cli(t, nil, f, append([]string{"dead-letters", "export", "--scope", "payments", "--page", "1000"}, dsnArgs...)...)
	if r.code != exitOK || !strings.Contains(r.stderr, "exported 2500 dead letters to -") {
		t.Fatal(r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 2500 {
		t.Fatalf("%d lines, want 2500", len(lines))
	}
	for i, l := range lines {
		var d deadLetterJSON
		if err := json.Unmarshal([]byte(l), &d); err != nil || d.ID != int64(i+1) || string(d.Payload) != fmt.Sprintf(`{"n":%d}`, i+1) {
			t.Fatalf("line %d: %v %+v", i, err, d)
		}
	}
	if !strings.Contains(lines[0], `"payload":"eyJuIjoxfQ=="`) {
		t.Fatalf("payload not base64: %s", lines[0])
	}
	if len(f.scans) != 3 || f.scans[0].AfterID != 0 || f.scans[1].AfterID != 1000 || f.scans[2].AfterID != 2000 || f.scans[0].Limit != 1000 || f.scans[0].Scope != "payments" {
		t.Fatalf("pages: %+v", f.scans)
	}

	file := filepath.Join(t.TempDir(), "dl.jsonl")
	r = cli(t, nil, &fakeDL{dls: sampleDLs(3)}, append([]string{"dead-letters", "export", "--file", file}, dsnArgs...)...)
	b, err := os.ReadFile(file)
	if r.code != 0 || err != nil || strings.Count(string(b), "\n") != 3 || r.stdout != "" {
		t.Fatalf("export --file: %v, %v\n%s", r, err, b)
	}
	if st, _ := os.Stat(file); st.Mode().Perm() != 0o600 {
		t.Fatalf("export file mode %v, want 0600", st.Mode().Perm())
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "export", "--file", filepath.Join(t.TempDir(), "no", "dir", "x")}, dsnArgs...)...); r.code != exitRuntime {
		t.Fatalf("export to a missing directory: %v", r)
	}
	if r := cli(t, nil, f, append([]string{"dead-letters", "export", "--page", "0"}, dsnArgs...)...); r.code != exitUsage {
		t.Fatalf("export --page 0: %v", r)
	}
}

func TestDeadLettersRedrive(t *testing.T) {
	f := &fakeDL{summary: RedriveSummary{Matched: 10, Redriven: 8, Skipped: 2}}
	r := cli(t, nil, f, append([]string{"dead-letters", "redrive", "--scope", "payments", "--reason", "attempts_exhausted", "--since", "2026-12-01T08:00:00Z",
		"--batch", "100", "--operator", "alice"}, dsnArgs...)...)
	if r.code != exitOK || r.stdout != "matched 10\nredriven 8\nskipped 2\n" || !strings.Contains(r.stderr, "redrive: 5 of 10 dead letters done") {
		t.Fatal(r)
	}
	if o, flt := f.redrive[0], f.redriveF[0]; o.DryRun || o.Batch != 100 || o.Operator != "alice" || flt.Scope != "payments" || flt.Reason != "attempts_exhausted" || flt.Since.Hour() != 8 {
		t.Fatalf("options %+v, filter %+v", o, flt)
	}
	r = cli(t, nil, f, append([]string{"dead-letters", "redrive", "--all", "--dry-run", "-o", "json"}, dsnArgs...)...)
	var js redriveJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &js) != nil || js != (redriveJSON{Matched: 10, WouldRedrive: 8, Skipped: 2, DryRun: true}) || !f.redrive[1].DryRun {
		t.Fatalf("redrive --all --dry-run -o json: %v", r)
	}
	// A dry run's progress says nothing was done.
	if strings.Contains(r.stderr, "done") || !strings.Contains(r.stderr, "redrive: 10 of 10 dead letters checked (dry run: nothing changed)") {
		t.Fatalf("redrive --dry-run progress: %v", r)
	}
	f.redriveErr, f.summary = errors.New("connection reset"), RedriveSummary{Matched: 4, Redriven: 2}
	if r := cli(t, nil, f, append([]string{"dead-letters", "redrive", "--scope", "x"}, dsnArgs...)...); r.code != exitRuntime || !strings.Contains(r.stderr, "connection reset") || !strings.Contains(r.stderr, "2 re-driven") {
		t.Fatalf("failing redrive: %v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no filter selects the dead letters"},
		{[]string{"--all", "--scope", "x"}, "--all is not for filters"},
		{[]string{"--scope", "x", "--batch", "0"}, "--batch 0 must be 1 to 10000"},
		{[]string{"--scope", "x", "--operator", strings.Repeat("o", 256)}, "--operator must be at most 255 bytes"},
	} {
		r := cli(t, nil, f, append(append([]string{"dead-letters", "redrive"}, c.args...), dsnArgs...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("redrive %v: want exit 2 with %q\n%v", c.args, c.want, r)
		}
	}
}

func TestDeadLettersRepublish(t *testing.T) {
	f := &fakeDL{repResult: RepublishResult{OutboxID: "0191f5b4-6c1e-7c4e-9d1a-3b2f0e8a9c11", MessageID: "m-1#redrive-1"}}
	r := cli(t, nil, f, append([]string{"dead-letters", "republish", "1", "--topic", "payments.retry", "--new-message-id", "--operator", "bob"}, dsnArgs...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "dead letter 1 republished: outbox row 0191f5b4-6c1e-7c4e-9d1a-3b2f0e8a9c11, message ID m-1#redrive-1") {
		t.Fatal(r)
	}
	if o := f.republish[0]; o.Topic != "payments.retry" || !o.NewMessageID || o.Operator != "bob" {
		t.Fatalf("options %+v", o)
	}
	f.repResult.Already = true
	r = cli(t, nil, f, append([]string{"dead-letters", "republish", "1", "-o", "json"}, dsnArgs...)...)
	var js republishJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &js) != nil || !js.Already || js.DeadLetterID != 1 || js.MessageID != "m-1#redrive-1" || f.republish[1].NewMessageID {
		t.Fatalf("republish -o json: %v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"1", "--redis", "redis://127.0.0.1:1/0", "--dsn", ""}, "not for a Redis-only store (--redis): it has no outbox"},
		{nil, "want 1 argument(s)"},
		{[]string{"x"}, `ID "x"`},
		{[]string{"1", "--outbox-table", ""}, "--outbox-table must not be empty"},
	} {
		r := cli(t, nil, f, append(append([]string{"dead-letters", "republish"}, dsnArgs...), c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("republish %v: want exit 2 with %q\n%v", c.args, c.want, r)
		}
	}
}

func TestDeadLettersPurge(t *testing.T) {
	f := &fakeDL{purgeN: 12}
	r := cli(t, nil, f, append([]string{"dead-letters", "purge", "--older-than", "720h", "--batch", "50", "--progress", "0"}, dsnArgs...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "purged 12 dead letters older than 720h0m0s") || !strings.Contains(r.stderr, "purge: 12 rows deleted") {
		t.Fatal(r)
	}
	if o := f.purged[0]; o.OlderThan != 720*time.Hour || o.Batch != 50 {
		t.Fatalf("options %+v", o)
	}
	rf := &fakeRedisDL{}
	r = cli(t, nil, rf, "dead-letters", "purge", "--older-than", "48h", "--redis", "redis://127.0.0.1:1/0", "-o", "json")
	var js purgeResult
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &js) != nil || js.Deleted != 7 || rf.olderThan != 48*time.Hour {
		t.Fatalf("redis purge: %v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--older-than is required"},
		{[]string{"--older-than", "30s"}, "at least 1m"},
		{[]string{"--older-than", "1h", "--batch", "0"}, "--batch 0"},
		{[]string{"--older-than", "1h", "--batch", "10", "--redis", "redis://127.0.0.1:1/0", "--dsn", ""}, "--batch is for Postgres"},
	} {
		r := cli(t, nil, f, append(append([]string{"dead-letters", "purge"}, dsnArgs...), c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("purge %v: want exit 2 with %q\n%v", c.args, c.want, r)
		}
	}
}

// Flags fall back to their environment variables; a flag given wins.
func TestEnvConfig(t *testing.T) {
	f := &fakeDL{dls: sampleDLs(1)}
	env := map[string]string{"IDEMQ_DATABASE_URL": testDSN, "IDEMQ_SCHEMA": "ops"}
	var seen storeFlags
	var out, errb bytes.Buffer
	a := &app{stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] }}
	a.openDeadLetters = func(_ context.Context, sf *storeFlags) (any, func(), error) { seen = *sf; return f, func() {}, nil }
	if code := a.execute(context.Background(), []string{"dead-letters", "list"}); code != 0 || seen.db.dsn != testDSN || seen.db.schema != "ops" {
		t.Fatalf("exit %d, store flags %+v\n%s", code, seen, errb.String())
	}
	if code := a.execute(context.Background(), []string{"dead-letters", "list", "--schema", "other"}); code != 0 || seen.db.schema != "other" {
		t.Fatalf("exit %d: the flag did not win over IDEMQ_SCHEMA: %+v", code, seen)
	}
	// IDEMQ_REDIS_URL alone selects the Redis-only store.
	env = map[string]string{"IDEMQ_REDIS_URL": "redis://127.0.0.1:1/0", "IDEMQ_REDIS_PREFIX": "pfx"}
	if code := a.execute(context.Background(), []string{"dead-letters", "list", "--scope", "s"}); code != 0 || seen.redisURL == "" || seen.prefix != "pfx" {
		t.Fatalf("exit %d: %+v", code, seen)
	}
	if isRedis, err := seen.useRedis(); !isRedis || err != nil {
		t.Fatalf("useRedis = %v, %v", isRedis, err)
	}
}

// TestExitCodeNotFound: a missing record, dead letter or outbox row exits 3,
// apart from a failure of the work (1) and a usage error (2).
func TestExitCodeNotFound(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("inspect: %w: scope %q", dedup.ErrNotFound, "s"), exitNotFound},
		{fmt.Errorf("outbox: %w", outbox.ErrNotFound), exitNotFound},
		{errors.New("connection refused"), exitRuntime},
		{usagef("--scope is required"), exitUsage},
		{usageError{fmt.Errorf("%w", dedup.ErrNotFound)}, exitUsage},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// TestWriteObjectTable: inspect -o table prints one "field: value" line
// per field, nested fields with dots, empty and null values as "-".
func TestWriteObjectTable(t *testing.T) {
	var b bytes.Buffer
	v := struct {
		Status   string         `json:"status"`
		Attempts int            `json:"attempts"`
		Error    string         `json:"last_error"`
		Expires  *time.Time     `json:"expires_at"`
		HTTP     map[string]any `json:"http"`
	}{Status: "SUCCEEDED", Attempts: 2, HTTP: map[string]any{"status": 201}}
	if err := writeObject(&b, "table", v); err != nil {
		t.Fatal(err)
	}
	want := "attempts:     2\nexpires_at:   -\nhttp.status:  201\nlast_error:   -\nstatus:       SUCCEEDED\n"
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	if err := writeObject(&b, "json", v); err != nil || !strings.Contains(b.String(), `"status": "SUCCEEDED"`) {
		t.Fatalf("json: %v %s", err, b.String())
	}
}
