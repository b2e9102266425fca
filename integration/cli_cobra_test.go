package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cliRun runs the built idemq with args and returns stdout, stderr and the
// exit code.
func cliRun(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return cliRunEnv(t, bin, nil, args...)
}

// The outbox verbs on a real table: parked lists the parked rows (table
// and JSON), unpark selects them by topic, key, ID or all (--dry-run
// counts and changes nothing), stats and purge summarize as JSON, and the
// purge deletes exactly the published rows older than --older-than.
func TestCLIOutboxParkedUnparkPurge(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	db := []string{"--dsn", postgresDSN(t), "--schema", o.schema}
	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := cliRun(t, bin, append(args, db...)...)
		if code != 0 {
			t.Fatalf("idemq %v: exit %d\n%s%s", args, code, out, errOut)
		}
		return out
	}
	jsonOf := func(v any, args ...string) {
		t.Helper()
		out := run(append(args, "-o", "json")...)
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("idemq %v -o json: %v\n%s", args, err, out)
		}
	}
	o.addRows(t, "cli-a", 4, 2, "a") // keys key-00, key-01
	o.addRows(t, "cli-b", 2, 2, "b")
	o.addRows(t, "cli-c", 3, 3, "c") // published below
	tbl := o.table("outbox")
	o.exec(`update ` + tbl + ` set parked_at = now(), attempts = 25, last_error = 'message too large' where topic in ('cli-a', 'cli-b')`)
	o.exec(`update ` + tbl + ` set published_at = now() - interval '48 hours', published_by = 'old' where topic = 'cli-c' and convert_from(payload, 'UTF8') like '%"n":0}'`)
	o.exec(`update ` + tbl + ` set published_at = now() - interval '1 hour', published_by = 'new' where topic = 'cli-c' and published_at is null`)

	var parked []struct {
		ID        string `json:"id"`
		Topic     string `json:"topic"`
		Key       string `json:"key"`
		Attempts  int    `json:"attempts"`
		LastError string `json:"last_error"`
	}
	jsonOf(&parked, "outbox", "parked")
	if len(parked) != 6 || parked[0].Attempts != 25 || parked[0].LastError != "message too large" || parked[0].Topic != "cli-a" {
		t.Fatalf("outbox parked -o json: %+v", parked)
	}
	if out := run("outbox", "parked"); !strings.HasPrefix(out, "ID") || strings.Count(out, "\n") != 7 || !strings.Contains(out, "message too large") {
		t.Fatalf("outbox parked:\n%s", out)
	}

	type unpark struct {
		Unparked int64 `json:"unparked"`
		Matched  int64 `json:"matched"`
		DryRun   bool  `json:"dry_run"`
	}
	var u unpark
	jsonOf(&u, "outbox", "unpark", "--topic", "cli-a", "--dry-run")
	if u != (unpark{Matched: 4, DryRun: true}) || o.stats(t).Parked != 6 {
		t.Fatalf("unpark --topic --dry-run: %+v, %d parked", u, o.stats(t).Parked)
	}
	if out := run("outbox", "unpark", "--topic", "cli-a", "--key", "key-00"); out != "unparked 2 rows\n" {
		t.Fatalf("unpark --topic --key: %q", out)
	}
	if out := run("outbox", "unpark", parked[5].ID); out != "unparked 1 rows\n" {
		t.Fatalf("unpark ID: %q", out)
	}
	jsonOf(&u, "outbox", "unpark", "--all")
	if u != (unpark{Unparked: 3, Matched: 3}) {
		t.Fatalf("unpark --all: %+v", u)
	}

	var st struct {
		Pending   int64 `json:"pending"`
		Parked    int64 `json:"parked"`
		Published int64 `json:"published"`
	}
	jsonOf(&st, "outbox", "stats")
	if st.Pending != 6 || st.Parked != 0 || st.Published != 3 {
		t.Fatalf("outbox stats -o json: %+v", st)
	}
	var pr struct {
		Deleted int64 `json:"deleted"`
	}
	jsonOf(&pr, "outbox", "purge", "--older-than", "24h", "--batch", "1")
	if pr.Deleted != 1 || o.stats(t).Published != 2 {
		t.Fatalf("outbox purge: %+v, %d published left", pr, o.stats(t).Published)
	}
	if out := run("outbox", "purge", "--older-than", "30m"); !strings.HasPrefix(out, "purged 2 published rows older than 30m0s") {
		t.Fatalf("outbox purge: %q", out)
	}
	if _, errOut, code := cliRun(t, bin, append([]string{"outbox", "unpark"}, db...)...); code != 2 || !strings.Contains(errOut, "say which rows") {
		t.Fatalf("outbox unpark without a selection: exit %d\n%s", code, errOut)
	}
}

// migrate and dead-letters list summarize as one JSON value; inspect of a
// missing record exits 1.
func TestCLIJSONOutput(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, nil)
	db := []string{"--dsn", postgresDSN(t), "--schema", e.schema}
	var m struct {
		Schema string   `json:"schema"`
		Tables []string `json:"tables"`
		Action string   `json:"action"`
	}
	for _, c := range []struct {
		args   []string
		action string
	}{{[]string{"migrate"}, "migrated"}, {[]string{"migrate", "--check"}, "checked"}} {
		out, errOut, code := cliRun(t, bin, append(append(c.args, "-o", "json"), db...)...)
		if code != 0 || json.Unmarshal([]byte(out), &m) != nil || m.Schema != e.schema || m.Action != c.action || len(m.Tables) != 2 {
			t.Fatalf("idemq %v -o json: exit %d %+v\n%s%s", c.args, code, m, out, errOut)
		}
	}
	e.exec(`insert into ` + e.table("dead_letters") + ` (scope, message_id, business_key, reason, error, attempts, created_at)
		values ('json', 'm-1', 'bk-1', 'permanent_error', 'declined', 2, now())`)
	out, errOut, code := cliRun(t, bin, append([]string{"dead-letters", "list", "--scope", "json", "-o", "json"}, db...)...)
	var dls []struct {
		ID        int64  `json:"id"`
		MessageID string `json:"message_id"`
		Reason    string `json:"reason"`
		Error     string `json:"error"`
		Attempts  int    `json:"attempts"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &dls) != nil || len(dls) != 1 || dls[0].MessageID != "m-1" || dls[0].Reason != "permanent_error" || dls[0].Attempts != 2 {
		t.Fatalf("dead-letters list -o json: exit %d %+v\n%s%s", code, dls, out, errOut)
	}
	if _, errOut, code := cliRun(t, bin, append([]string{"inspect", "--scope", "json", "--message-id", "nope"}, db...)...); code != 3 || !strings.Contains(errOut, "not found") {
		t.Fatalf("inspect of a missing record: exit %d\n%s", code, errOut)
	}
}

// relay --once against a broker that refuses connections exits 1, prints
// how many rows stayed pending (all of them: nothing is lost or parked),
// and with --log-format json its logs and final error are JSON lines.
func TestCLIRelayOnceBrokerDown(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	o.addRows(t, "cli-down", 5, 5, "down")
	out, errOut, code := cliRun(t, bin, "relay", "--once", "--dsn", postgresDSN(t), "--schema", o.schema,
		"--kafka-brokers", "127.0.0.1:1", "--publish-timeout", "5s", "--log-format", "json", "-o", "json")
	var sum struct {
		Published   int   `json:"published"`
		Failed      int   `json:"failed"`
		Unavailable int   `json:"unavailable"`
		Pending     int64 `json:"pending"`
	}
	if code != 1 || json.Unmarshal([]byte(out), &sum) != nil || sum.Published != 0 || sum.Pending != 5 || sum.Failed+sum.Unavailable == 0 {
		t.Fatalf("relay --once, broker down: exit %d %+v\n%s%s", code, sum, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("a log line is not JSON: %q", l)
		}
	}
	var last struct {
		Level string `json:"level"`
		Msg   string `json:"msg"`
	}
	if json.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil || last.Level != "ERROR" || !strings.Contains(last.Msg, "5 rows stay pending") {
		t.Fatalf("final error line: %q", lines[len(lines)-1])
	}
	if s := o.stats(t); s.Pending != 5 || s.Parked != 0 {
		t.Fatalf("outbox after the failed drain: %+v", s)
	}
	if u, err := url.Parse(postgresDSN(t)); err == nil {
		if pw, ok := u.User.Password(); ok && pw != "" && strings.Contains(errOut, ":"+pw+"@") {
			t.Fatalf("a DSN with its password in the logs:\n%s", errOut)
		}
	}
	if !strings.Contains(errOut, `"database":"postgres://`) {
		t.Fatalf("the start line names no database (redacted DSN):\n%s", errOut)
	}
}

// relay --metrics-addr serves /healthz, /readyz and /metrics (the relay's
// and the outbox's collectors) while it publishes, and stops on SIGTERM
// with exit 0.
func TestCLIRelayMetricsEndpoints(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	o.addRows(t, topic, 20, 4, "metrics")
	cmd := exec.Command(bin, "relay", "--dsn", postgresDSN(t), "--schema", o.schema, "--kafka-brokers", strings.Join(kafkaBrokers(t), ","),
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json", "--name", "metrics-relay", "--poll-interval", "100ms", "--no-purge")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	addrc := make(chan string, 1)
	var logs bytes.Buffer
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"metrics_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Addr != "" {
				addrc <- rec.Addr
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never logged its metrics address")
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	eventually(t, 30*time.Second, "/readyz to answer 200", func() bool { code, _ := get("/readyz"); return code == 200 })
	eventually(t, 60*time.Second, "the rows to be published", func() bool { return o.stats(t).Published == 20 })
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, `idemq_relay_published_total{relay="metrics-relay"} 20`) ||
		!strings.Contains(body, `idemq_outbox_rows{state="published"} 20`) || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		<-logDone
		t.Fatalf("relay after SIGTERM: %v\n%s", err, logs.String())
	}
	<-logDone
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !json.Valid([]byte(l)) {
			t.Fatalf("a log line is not JSON: %q", l)
		}
	}
}

// outbox purge shows its progress on stderr and, interrupted by SIGINT,
// reports how many rows it deleted (exactly what left the table) and exits
// 1.
func TestCLIOutboxPurgeInterrupt(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	const total = 20000
	tbl := o.table("outbox")
	o.exec(`insert into `+tbl+` (id, topic, payload, created_at, published_at, published_by)
		select gen_random_uuid(), 'cli-purge', '\x00', now() - interval '3 days', now() - interval '2 days', 'old'
		from generate_series(1, $1::int)`, total)
	cmd := exec.Command(bin, "outbox", "purge", "--dsn", postgresDSN(t), "--schema", o.schema, "--batch", "1", "--progress", "0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	var lines []string
	progress := regexp.MustCompile(`^purge: (\d+) rows deleted, \d+ rows/s`)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if m := progress.FindStringSubmatch(sc.Text()); m != nil {
			if n, _ := strconv.Atoi(m[1]); n >= 10 {
				break
			}
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	var exit *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("outbox purge after SIGINT: %v, want exit 1\n%s", err, strings.Join(lines, "\n"))
	}
	m := regexp.MustCompile(`outbox purge interrupted: (\d+) published rows older than 24h0m0s deleted before it stopped`).FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("last stderr line %q does not report the count", lines[len(lines)-1])
	}
	reported, _ := strconv.Atoi(m[1])
	left := o.count(`select count(*) from ` + tbl + ` where topic = 'cli-purge'`)
	if reported < 10 || reported >= total || total-left != reported {
		t.Fatalf("reported %d deleted, the table lost %d of %d", reported, total-left, total)
	}
}
