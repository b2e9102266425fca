package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// The dead letters of the CLI tests: two scopes, two reasons, payloads of
// every kind show decodes (JSON, text, binary).
var cliDLs = []struct {
	scope, id, reason string
	payload           []byte
}{
	{"orders", "o-1", dedup.ReasonPermanentError, []byte(`{"amount":3,"sku":"a-1"}`)},
	{"orders", "o-2", dedup.ReasonPermanentError, []byte("plain text payload")},
	{"orders", "o-3", dedup.ReasonAttemptsExhausted, []byte{0xff, 0x00, 0x01, 0xfe}},
	{"mail", "m-1", dedup.ReasonPermanentError, []byte(`{"to":"x@example.com"}`)},
	{"mail", "m-2", dedup.ReasonAttemptsExhausted, []byte("retry me")},
}

// cliDLMessage is dead letter i of cliDLs as a delivery, with a header.
func cliDLMessage(t *testing.T, i int) *dedup.Message {
	d := cliDLs[i]
	m := msg(t, d.scope, d.id, "bk-"+d.id, "")
	m.Payload = d.payload
	m.Headers["trace-tag"] = "tag-" + d.id
	m.Key = []byte("key-" + d.id)
	return m
}

// cliDLError is the handler error that makes dead letter i's reason (the
// stores run with MaxAttempts 1: a retryable error exhausts the attempts).
func cliDLError(i int) error {
	if cliDLs[i].reason == dedup.ReasonPermanentError {
		return dedup.Permanent(fmt.Errorf("rejected %s", cliDLs[i].id))
	}
	return fmt.Errorf("timeout %s", cliDLs[i].id)
}

// dlJSON is the JSON of list, show and export (the fields the tests read).
type dlJSON struct {
	ID           int64             `json:"id"`
	Scope        string            `json:"scope"`
	MessageID    string            `json:"message_id"`
	BusinessKey  string            `json:"business_key"`
	Reason       string            `json:"reason"`
	Error        string            `json:"error"`
	Attempts     int               `json:"attempts"`
	Topic        string            `json:"topic"`
	Key          []byte            `json:"key"`
	Payload      []byte            `json:"payload"`
	PayloadBytes int               `json:"payload_bytes"`
	Headers      map[string]string `json:"headers"`
	CreatedAt    time.Time         `json:"created_at"`
	RedrivenAt   *time.Time        `json:"redriven_at"`
	Decoding     string            `json:"decoding"`
	Decoded      string            `json:"decoded"`
}

// dlCLI runs the built idemq against one store (its flags appended).
type dlCLI struct {
	t     *testing.T
	bin   string
	store []string
}

func (c dlCLI) run(args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	return cliRun(c.t, c.bin, append(append([]string{"dead-letters"}, args...), c.store...)...)
}

// ok runs args and fails the test unless it exits 0; it returns stdout.
func (c dlCLI) ok(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("dead-letters %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errOut)
	}
	return out
}

// fails runs args and fails the test unless it exits code with want in
// its stderr.
func (c dlCLI) fails(code int, want string, args ...string) {
	c.t.Helper()
	out, errOut, got := c.run(args...)
	if got != code || !strings.Contains(errOut, want) {
		c.t.Fatalf("dead-letters %v: exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", args, got, code, want, out, errOut)
	}
}

func (c dlCLI) list(args ...string) []dlJSON {
	c.t.Helper()
	out := c.ok(append(append([]string{"list"}, args...), "-o", "json")...)
	var v []dlJSON
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		c.t.Fatalf("list %v -o json: %v\n%s", args, err, out)
	}
	return v
}

func (c dlCLI) show(id int64, args ...string) dlJSON {
	c.t.Helper()
	out := c.ok(append([]string{"show", strconv.FormatInt(id, 10), "-o", "json"}, args...)...)
	var v dlJSON
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		c.t.Fatalf("show %d -o json: %v\n%s", id, err, out)
	}
	return v
}

func messageIDs(v []dlJSON) string {
	ids := make([]string, len(v))
	for i, d := range v {
		ids[i] = d.MessageID
	}
	return strings.Join(ids, ",")
}

// readJSONLines parses an export.
func readJSONLines(t *testing.T, data string) []dlJSON {
	t.Helper()
	var out []dlJSON
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var d dlJSON
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatalf("export line %q: %v", sc.Text(), err)
		}
		out = append(out, d)
	}
	return out
}

// checkDLVerbsCommon runs what list, show, export and redrive must do on
// either store, over the dead letters of cliDLs, and returns them by
// message ID. status reads a record's status.
func checkDLVerbsCommon(t *testing.T, c dlCLI, status func(scope, id string) dedup.Status) map[string]dlJSON {
	t.Helper()
	// list: every dead letter, in ID order, without payload.
	all := c.list()
	if got := messageIDs(all); got != "o-1,o-2,o-3,m-1,m-2" {
		t.Fatalf("list -o json: %s", got)
	}
	byID := map[string]dlJSON{}
	for i, d := range all {
		w := cliDLs[i]
		if d.Scope != w.scope || d.Reason != w.reason || d.Payload != nil || d.PayloadBytes != len(w.payload) ||
			d.Attempts != 1 || d.BusinessKey != "bk-"+w.id || !strings.Contains(d.Error, w.id) || d.RedrivenAt != nil ||
			d.Headers["trace-tag"] != "tag-"+w.id || d.CreatedAt.IsZero() {
			t.Fatalf("list -o json [%d] = %+v, want %+v", i, d, w)
		}
		byID[d.MessageID] = d
	}
	// The table: a header, one line per dead letter, SCOPE without --scope.
	out := c.ok("list")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "SCOPE") ||
		!strings.Contains(lines[0], "REDRIVEN") || !strings.Contains(lines[1], "orders") || !strings.Contains(lines[1], "o-1") ||
		!strings.Contains(lines[1], "permanent_error") || !strings.Contains(lines[1], "rejected o-1") || !strings.Contains(lines[1], "false") {
		t.Fatalf("list:\n%s", out)
	}
	out = c.ok("list", "--scope", "mail")
	if lines := strings.Split(strings.TrimRight(out, "\n"), "\n"); len(lines) != 3 || strings.Contains(lines[0], "SCOPE") ||
		!strings.Contains(lines[1], "m-1") || !strings.Contains(lines[2], "m-2") || !strings.Contains(lines[2], "attempts_exhausted") {
		t.Fatalf("list --scope mail:\n%s", out)
	}

	// Filters.
	if got := messageIDs(c.list("--scope", "orders")); got != "o-1,o-2,o-3" {
		t.Fatalf("list --scope orders: %s", got)
	}
	if got := messageIDs(c.list("--reason", dedup.ReasonAttemptsExhausted)); got != "o-3,m-2" {
		t.Fatalf("list --reason attempts_exhausted: %s", got)
	}
	if got := messageIDs(c.list("--scope", "orders", "--reason", dedup.ReasonPermanentError)); got != "o-1,o-2" {
		t.Fatalf("list --scope orders --reason permanent_error: %s", got)
	}
	if got := messageIDs(c.list("--since", "1h")); got != "o-1,o-2,o-3,m-1,m-2" {
		t.Fatalf("list --since 1h: %s", got)
	}
	if out := c.ok("list", "--until", "1h", "-o", "json"); out != "[]\n" {
		t.Fatalf("list --until 1h -o json: %q", out)
	}
	// RFC 3339 bounds around m-1: created at or after m-1, before m-2.
	since := byID["m-1"].CreatedAt.Format(time.RFC3339Nano)
	if got := messageIDs(c.list("--since", since)); got != "m-1,m-2" {
		t.Fatalf("list --since %s: %s", since, got)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if got := messageIDs(c.list("--since", "2h", "--until", future, "--scope", "mail")); got != "m-1,m-2" {
		t.Fatalf("list --since 2h --until %s --scope mail: %s", future, got)
	}
	// Paging: --limit 2, then --after-id the last ID.
	var walked []dlJSON
	for after := int64(0); ; {
		page := c.list("--limit", "2", "--after-id", strconv.FormatInt(after, 10))
		if len(page) > 2 {
			t.Fatalf("list --limit 2 gave %d", len(page))
		}
		if len(page) == 0 {
			break
		}
		walked = append(walked, page...)
		after = page[len(page)-1].ID
	}
	if got := messageIDs(walked); got != "o-1,o-2,o-3,m-1,m-2" {
		t.Fatalf("paged walk: %s", got)
	}
	if got := messageIDs(c.list("--redriven", "false", "--scope", "mail")); got != "m-1,m-2" {
		t.Fatalf("list --redriven false: %s", got)
	}
	if got := c.list("--redriven", "true"); len(got) != 0 {
		t.Fatalf("list --redriven true before any re-drive: %s", messageIDs(got))
	}

	// show: payload decoded, headers, error, attempts.
	o1 := c.show(byID["o-1"].ID)
	if o1.Decoding != "auto" || o1.Decoded != `{"amount":3,"sku":"a-1"}` || !bytes.Equal(o1.Payload, cliDLs[0].payload) ||
		o1.Headers["trace-tag"] != "tag-o-1" || o1.Attempts != 1 || !strings.Contains(o1.Error, "rejected o-1") || string(o1.Key) != "key-o-1" {
		t.Fatalf("show o-1 -o json: %+v", o1)
	}
	if d := c.show(byID["o-1"].ID, "--decode", "json"); d.Decoded != "{\n  \"amount\": 3,\n  \"sku\": \"a-1\"\n}" {
		t.Fatalf("show --decode json: %q", d.Decoded)
	}
	if d := c.show(byID["o-2"].ID, "--decode", "text"); d.Decoded != "plain text payload" {
		t.Fatalf("show --decode text: %q", d.Decoded)
	}
	if d := c.show(byID["o-3"].ID, "--decode", "hex"); d.Decoded != "ff0001fe" {
		t.Fatalf("show --decode hex: %q", d.Decoded)
	}
	if d := c.show(byID["o-3"].ID, "--decode", "base64"); d.Decoded != "/wAB/g==" {
		t.Fatalf("show --decode base64: %q", d.Decoded)
	}
	if d := c.show(byID["o-3"].ID); d.Decoded != "/wAB/g==" { // auto: not UTF-8
		t.Fatalf("show (auto) of a binary payload: %q", d.Decoded)
	}
	if d := c.show(byID["o-2"].ID, "--decode-cmd", "tr a-z A-Z"); d.Decoding != "cmd" || d.Decoded != "PLAIN TEXT PAYLOAD" {
		t.Fatalf("show --decode-cmd: %+v", d)
	}
	out = c.ok("show", strconv.FormatInt(byID["m-2"].ID, 10))
	for _, want := range []string{"SCOPE", "mail", "MESSAGE ID", "m-2", "REASON", "attempts_exhausted", "ERROR", "timeout m-2",
		"ATTEMPTS", "HEADER trace-tag", "tag-m-2", "REDRIVEN", "false", "PAYLOAD", "8 bytes, auto:", "\nretry me\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("show m-2: no %q in\n%s", want, out)
		}
	}
	c.fails(3, "not found", "show", "999999999")
	if d := c.show(byID["o-1"].ID, "--scope", "orders"); d.MessageID != "o-1" {
		t.Fatalf("show --scope orders: %+v", d)
	}
	c.fails(3, "not found", "show", strconv.FormatInt(byID["o-1"].ID, 10), "--scope", "mail")
	c.fails(1, "not UTF-8", "show", strconv.FormatInt(byID["o-3"].ID, 10), "--decode", "text")
	c.fails(1, "--decode-cmd", "show", strconv.FormatInt(byID["o-2"].ID, 10), "--decode-cmd", "exit 3")

	// export: JSON Lines, to stdout and to a file, byte-exact payloads.
	lines2 := readJSONLines(t, c.ok("export", "--page", "2"))
	if got := messageIDs(lines2); got != "o-1,o-2,o-3,m-1,m-2" {
		t.Fatalf("export to stdout: %s", got)
	}
	for i, d := range lines2 {
		if !bytes.Equal(d.Payload, cliDLs[i].payload) || d.Headers["trace-tag"] != "tag-"+cliDLs[i].id {
			t.Fatalf("export line %d: payload %x headers %v, want %x", i, d.Payload, d.Headers, cliDLs[i].payload)
		}
	}
	file := filepath.Join(t.TempDir(), "dl.jsonl")
	out, errOut, code := c.run("export", "--scope", "orders", "--file", file)
	if code != 0 || out != "" || !strings.Contains(errOut, "exported 3 dead letters to "+file) {
		t.Fatalf("export --file: exit %d\n%s%s", code, out, errOut)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("export file mode: %v %v", fi.Mode(), err)
	}
	if got := readJSONLines(t, string(data)); messageIDs(got) != "o-1,o-2,o-3" || strings.Count(string(data), "\n") != 3 ||
		!bytes.Equal(got[2].Payload, cliDLs[2].payload) {
		t.Fatalf("export --file:\n%s", data)
	}

	// redrive --dry-run counts and changes nothing.
	out = c.ok("redrive", "--scope", "orders", "--dry-run")
	if out != "matched 3\nwould redrive 3\nskipped 0 (dry run: nothing changed)\n" {
		t.Fatalf("redrive --dry-run:\n%s", out)
	}
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		if st := status("orders", id); st != dedup.StatusFailedFinal {
			t.Fatalf("after --dry-run orders/%s is %s", id, st)
		}
	}
	// redrive --scope: records FAILED_RETRYABLE, summary on stdout,
	// progress on stderr; a second run re-drives nothing.
	out, errOut, code = c.run("redrive", "--scope", "orders", "--batch", "2")
	if code != 0 || out != "matched 3\nredriven 3\nskipped 0\n" || !strings.Contains(errOut, "redrive: 3 of 3 dead letters done") ||
		strings.Contains(errOut, "matched") {
		t.Fatalf("redrive --scope orders: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		if st := status("orders", id); st != dedup.StatusFailedRetryable {
			t.Fatalf("after redrive orders/%s is %s", id, st)
		}
	}
	for _, id := range []string{"m-1", "m-2"} {
		if st := status("mail", id); st != dedup.StatusFailedFinal {
			t.Fatalf("redrive --scope orders changed mail/%s: %s", id, st)
		}
	}
	var sum struct {
		Matched, Redriven, Skipped int64
		DryRun                     bool `json:"dry_run"`
	}
	out = c.ok("redrive", "--scope", "orders", "-o", "json")
	if err := json.Unmarshal([]byte(out), &sum); err != nil || sum.Matched != 3 || sum.Redriven != 0 || sum.Skipped != 3 {
		t.Fatalf("second redrive -o json: %+v %v\n%s", sum, err, out)
	}
	// After the re-drive, list shows it.
	for _, d := range c.list("--scope", "orders") {
		if d.RedrivenAt == nil {
			t.Fatalf("after redrive %s has no redriven_at", d.MessageID)
		}
	}
	if got := messageIDs(c.list("--redriven", "true")); got != "o-1,o-2,o-3" {
		t.Fatalf("list --redriven true: %s", got)
	}
	if got := messageIDs(c.list("--redriven", "false")); got != "m-1,m-2" {
		t.Fatalf("list --redriven false after the re-drive: %s", got)
	}
	if out := c.ok("list", "--scope", "orders"); len(regexp.MustCompile(`Z\s+true\s`).FindAllString(out, -1)) != 3 {
		t.Fatalf("list after redrive: want REDRIVEN true on 3 rows:\n%s", out)
	}
	if out := c.ok("show", strconv.FormatInt(byID["o-1"].ID, 10)); !regexp.MustCompile(`REDRIVEN\s+true\n`).MatchString(out) {
		t.Fatalf("show after redrive:\n%s", out)
	}

	// A dry run counts what a real run would skip (o-3, re-driven already).
	var dry struct {
		Matched, Redriven, Skipped int64
		Would                      int64 `json:"would_redrive"`
		DryRun                     bool  `json:"dry_run"`
	}
	out = c.ok("redrive", "--reason", dedup.ReasonAttemptsExhausted, "--dry-run", "-o", "json")
	if err := json.Unmarshal([]byte(out), &dry); err != nil || dry.Matched != 2 || dry.Redriven != 0 || dry.Would != 1 || dry.Skipped != 1 || !dry.DryRun {
		t.Fatalf("redrive --reason --dry-run -o json: %+v %v\n%s", dry, err, out)
	}
	// By reason and time range across scopes: o-3 was re-driven already.
	out = c.ok("redrive", "--reason", dedup.ReasonAttemptsExhausted, "--since", "1h", "--until", future)
	if out != "matched 2\nredriven 1\nskipped 1\n" || status("mail", "m-2") != dedup.StatusFailedRetryable || status("mail", "m-1") != dedup.StatusFailedFinal {
		t.Fatalf("redrive --reason --since --until:\n%s", out)
	}
	if got := messageIDs(c.list("--redriven", "false")); got != "m-1" {
		t.Fatalf("list --redriven false after the second re-drive: %s", got)
	}

	// Usage errors exit 2.
	c.fails(2, "--since", "list", "--since", "yesterday")
	c.fails(2, "--until", "list", "--until", "-5h")
	c.fails(2, "--limit", "list", "--limit", "0")
	c.fails(2, "--limit", "list", "--limit", "-1")
	c.fails(2, "--limit", "list", "--limit", "10001")
	c.fails(2, "--after-id", "list", "--after-id", "-1")
	c.fails(2, "--reason", "list", "--reason", "nope")
	c.fails(2, "--redriven", "list", "--redriven", "maybe")
	c.fails(2, "--all", "redrive")
	c.fails(2, "--all is not for filters", "redrive", "--all", "--scope", "orders")
	c.fails(2, "--batch", "redrive", "--scope", "orders", "--batch", "0")
	c.fails(2, "--page", "export", "--page", "0")
	c.fails(2, "ID", "show")
	c.fails(2, "ID", "show", "abc")
	c.fails(2, "--decode", "show", "1", "--decode", "rot13")
	c.fails(2, "--older-than", "purge")
	return byID
}

// The dead-letter verbs of idemq on Postgres, on dead letters the store
// made: list (table, JSON, every filter, paging), show (each decoding, a
// decoder command, not found), export (stdout and file, byte-exact), bulk
// redrive (dry run, progress, idempotent), republish through the outbox
// (once, a derived message ID), purge by age and the usage errors.
func TestCLIDeadLetterVerbs(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 1 })
	ob, err := outbox.New(e.pool, outbox.Config{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	for i := range cliDLs {
		res, err := e.store.Process(e.ctx, cliDLMessage(t, i), func(context.Context, pgx.Tx, *dedup.Message) error { return cliDLError(i) })
		if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.Reason != cliDLs[i].reason {
			t.Fatalf("%s: %+v %v, want a dead letter (%s)", cliDLs[i].id, res, err, cliDLs[i].reason)
		}
	}
	c := dlCLI{t: t, bin: bin, store: []string{"--dsn", postgresDSN(t), "--schema", e.schema}}
	byID := checkDLVerbsCommon(t, c, func(scope, id string) dedup.Status { return e.record(scope, id).Status })

	// Postgres only: --scope-prefix.
	if got := messageIDs(c.list("--scope-prefix", "ord")); got != "o-1,o-2,o-3" {
		t.Fatalf("list --scope-prefix ord: %s", got)
	}
	c.fails(2, "not both", "list", "--scope-prefix", "ord", "--scope", "orders")

	// republish: one outbox row with the dead letter's message ID; again:
	// already, no second row; --new-message-id: the derived ID.
	m1 := byID["m-1"]
	id := strconv.FormatInt(m1.ID, 10)
	out := c.ok("republish", id, "--topic", "mail-replay")
	if !strings.Contains(out, "dead letter "+id+" republished") || !strings.Contains(out, "message ID m-1") {
		t.Fatalf("republish:\n%s", out)
	}
	rows, err := ob.List(e.ctx, outbox.ListOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Topic != "mail-replay" || rows[0].MessageID != "m-1" || !bytes.Equal(rows[0].Payload, cliDLs[3].payload) ||
		string(rows[0].Key) != "key-m-1" || rows[0].Headers["trace-tag"] != "tag-m-1" || !strings.Contains(out, rows[0].ID.String()) {
		t.Fatalf("outbox after republish: %+v\n%s", rows, out)
	}
	out = c.ok("republish", id, "--topic", "mail-replay")
	if !strings.Contains(out, "already republished") || !strings.Contains(out, rows[0].ID.String()) {
		t.Fatalf("second republish:\n%s", out)
	}
	var rp struct {
		OutboxID  string `json:"outbox_id"`
		MessageID string `json:"message_id"`
		Already   bool   `json:"already"`
	}
	out = c.ok("republish", id, "--topic", "mail-replay", "--new-message-id", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rp); err != nil || rp.Already || rp.MessageID != dedup.RedriveAsNewID("m-1", m1.ID) {
		t.Fatalf("republish --new-message-id -o json: %+v %v\n%s", rp, err, out)
	}
	if rows, err = ob.List(e.ctx, outbox.ListOptions{Limit: 100}); err != nil || len(rows) != 2 || rows[1].MessageID != rp.MessageID || rows[1].ID.String() != rp.OutboxID {
		t.Fatalf("outbox after republish --new-message-id: %+v %v", rows, err)
	}
	// Its own topic by default ("payments", the message's).
	out = c.ok("republish", strconv.FormatInt(byID["m-2"].ID, 10), "-o", "json")
	if err := json.Unmarshal([]byte(out), &rp); err != nil || rp.Already || rp.MessageID != "m-2" {
		t.Fatalf("republish to its own topic: %+v %v\n%s", rp, err, out)
	}
	if rows, err = ob.List(e.ctx, outbox.ListOptions{Limit: 100}); err != nil || len(rows) != 3 || rows[2].Topic != "payments" {
		t.Fatalf("outbox after republish to its own topic: %+v %v", rows, err)
	}
	// A republish that fails (no such outbox table) leaves no audit mark:
	// the next one to that table is not "already".
	c.fails(1, "no_such_outbox", "republish", strconv.FormatInt(byID["o-1"].ID, 10), "--outbox-table", "no_such_outbox")
	out = c.ok("republish", strconv.FormatInt(byID["o-1"].ID, 10), "--topic", "orders-replay", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rp); err != nil || rp.Already || rp.MessageID != "o-1" {
		t.Fatalf("republish after a failed one: %+v %v\n%s", rp, err, out)
	}
	c.fails(2, "ID", "republish")
	c.fails(2, "ID", "republish", "x1")
	c.fails(3, "not found", "republish", "999999999", "--topic", "t")

	// purge --older-than 1h deletes nothing new; one made old goes.
	out = c.ok("purge", "--older-than", "1h")
	if !strings.HasPrefix(out, "purged 0 dead letters older than 1h0m0s") {
		t.Fatalf("purge --older-than 1h:\n%s", out)
	}
	// m-1, republished twice: its audit rows go with it.
	audit := e.table("dead_letters_republishes")
	if n := e.count(`select count(*) from `+audit+` where dead_letter_id = $1`, m1.ID); n != 2 {
		t.Fatalf("%d republish audit rows of m-1, want 2", n)
	}
	e.exec(`update `+e.table("dead_letters")+` set created_at = now() - interval '2 hours' where id = $1`, m1.ID)
	var pr struct {
		Deleted int64 `json:"deleted"`
	}
	out, errOut, code := c.run("purge", "--older-than", "1h", "--progress", "0", "-o", "json")
	if err := json.Unmarshal([]byte(out), &pr); err != nil || code != 0 || pr.Deleted != 1 || !strings.Contains(errOut, "purge: 1 rows deleted") {
		t.Fatalf("purge of the old one: exit %d, %+v %v\n%s%s", code, pr, err, out, errOut)
	}
	if got := messageIDs(c.list()); got != "o-1,o-2,o-3,m-2" {
		t.Fatalf("after the purge: %s", got)
	}
	if n := e.count(`select count(*) from `+audit+` where dead_letter_id = $1`, m1.ID); n != 0 {
		t.Fatalf("%d republish audit rows of the purged m-1 left", n)
	}
	if n := e.count(`select count(*) from ` + audit); n != 2 {
		t.Fatalf("%d republish audit rows left, want those of m-2 and o-1", n)
	}
	c.fails(3, "not found", "republish", id, "--topic", "mail-replay")
	c.fails(2, "--older-than", "purge", "--older-than", "1s")
}

// The same verbs on a Redis-only store (--redis): REDRIVEN shows true
// after a re-drive, republish is refused (no outbox), purge goes by age.
func TestCLIDeadLetterVerbsRedis(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	s := newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	for i := range cliDLs {
		res, err := s.ProcessLeased(ctx, cliDLMessage(t, i), func(context.Context, *dedup.Message) error { return cliDLError(i) },
			dedup.LeaseOptions{TTL: 10 * time.Second})
		if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.Reason != cliDLs[i].reason {
			t.Fatalf("%s: %+v %v, want a dead letter (%s)", cliDLs[i].id, res, err, cliDLs[i].reason)
		}
		time.Sleep(2 * time.Millisecond) // distinct stream IDs across scopes, so the order is the test's
	}
	c := dlCLI{t: t, bin: bin, store: []string{"--redis", "redis://" + redisAddress(t) + "/0", "--redis-prefix", s.Config().Prefix}}
	byID := checkDLVerbsCommon(t, c, func(scope, id string) dedup.Status {
		r, err := s.Lookup(ctx, scope, id)
		if err != nil {
			t.Fatalf("record %s/%s: %v", scope, id, err)
		}
		return r.Status
	})

	// Redis numbers IDs per scope's stream: two scopes may share one, and
	// show then needs --scope.
	twin := time.Now().UnixMilli()
	for _, scope := range []string{"twin-a", "twin-b"} {
		if err := s.Config().Client.XAdd(ctx, &redis.XAddArgs{Stream: redisDLStream(s.Config().Prefix, scope), ID: fmt.Sprintf("%d-0", twin),
			Values: []any{"scope", scope, "message_id", "t-" + scope, "reason", dedup.ReasonPermanentError, "payload", "p-" + scope, "created_ms", fmt.Sprint(twin)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	twinID := strconv.FormatInt(twin*1_000_000, 10)
	c.fails(1, "give --scope", "show", twinID)
	if d := c.show(twin*1_000_000, "--scope", "twin-b"); d.Scope != "twin-b" || d.MessageID != "t-twin-b" {
		t.Fatalf("show %s --scope twin-b: %+v", twinID, d)
	}
	c.fails(3, "not found", "show", twinID, "--scope", "orders")
	if got := messageIDs(c.list()); got != "o-1,o-2,o-3,m-1,m-2,t-twin-a,t-twin-b" {
		t.Fatalf("list with twin IDs: %s", got)
	}
	// Pages of one never split the twins, nor repeat or lose one.
	if got := messageIDs(readJSONLines(t, c.ok("export", "--page", "1"))); got != "o-1,o-2,o-3,m-1,m-2,t-twin-a,t-twin-b" {
		t.Fatalf("export --page 1 with twin IDs: %s", got)
	}
	if got := messageIDs(c.list("--after-id", strconv.FormatInt(byID["m-2"].ID, 10), "--limit", "1")); got != "t-twin-a,t-twin-b" {
		t.Fatalf("list --limit 1 at the twin IDs: %s", got)
	}

	c.fails(2, "not for a Redis-only store (--redis): it has no outbox", "republish", strconv.FormatInt(byID["m-1"].ID, 10), "--topic", "t")
	c.fails(2, "Postgres only", "list", "--scope-prefix", "ord")
	c.fails(2, "--batch", "purge", "--older-than", "1h", "--batch", "10")

	out := c.ok("purge", "--older-than", "1h")
	if !strings.HasPrefix(out, "purged 0 dead letters older than 1h0m0s") {
		t.Fatalf("purge --older-than 1h:\n%s", out)
	}
	// An old dead letter (stream IDs are creation times: add it to a scope
	// of its own, whose stream has none younger).
	at := time.Now().Add(-2 * time.Hour).UnixMilli()
	if err := s.Config().Client.XAdd(ctx, &redis.XAddArgs{Stream: redisDLStream(s.Config().Prefix, "old"), ID: fmt.Sprintf("%d-0", at),
		Values: []any{"scope", "old", "message_id", "old-1", "reason", dedup.ReasonAttemptsExhausted, "created_ms", fmt.Sprint(at)}}).Err(); err != nil {
		t.Fatal(err)
	}
	if got := messageIDs(c.list("--scope", "old")); got != "old-1" {
		t.Fatalf("list --scope old: %s", got)
	}
	var pr struct {
		Deleted int64 `json:"deleted"`
	}
	out = c.ok("purge", "--older-than", "1h", "-o", "json")
	if err := json.Unmarshal([]byte(out), &pr); err != nil || pr.Deleted != 1 {
		t.Fatalf("purge of the old one: %+v %v\n%s", pr, err, out)
	}
	if got := messageIDs(c.list()); got != "o-1,o-2,o-3,m-1,m-2,t-twin-a,t-twin-b" {
		t.Fatalf("after the purge: %s", got)
	}
}
