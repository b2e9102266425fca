package integration

import (
	"bufio"
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// idemq purge shows its progress on stderr and, interrupted by SIGINT,
// reports how many records it deleted (exactly what left the table) and
// exits non-zero.
func TestCLIPurgeProgressAndInterrupt(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, nil)
	const total = 20000
	e.exec(`insert into `+e.schema+`.consumption_records (scope, message_id, fingerprint, fingerprint_key_id, status, created_at, expires_at)
		select 'purge', 'm-' || g, '\x00', 'k1', 'SUCCEEDED', now() - interval '8 days', now() - interval '1 day'
		from generate_series(1, $1::int) g`, total)
	cmd := exec.Command(bin, "purge", "--dsn", postgresDSN(t), "--schema", e.schema, "--batch", "1", "--progress", "0")
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
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("purge after SIGINT: %v, want a non-zero exit\n%s", err, strings.Join(lines, "\n"))
	}
	last := lines[len(lines)-1]
	m := regexp.MustCompile(`purge interrupted: (\d+) expired records deleted before it stopped`).FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("last stderr line %q does not report the count\n%s", last, strings.Join(lines, "\n"))
	}
	reported, _ := strconv.Atoi(m[1])
	var left int
	if err := e.pool.QueryRow(e.ctx, `select count(*) from `+e.schema+`.consumption_records where scope = 'purge'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if reported < 10 || reported >= total || total-left != reported {
		t.Fatalf("reported %d deleted, the table lost %d of %d", reported, total-left, total)
	}
}

// idemq purge --dead-letters deletes the dead letters older than
// --older-than and keeps the younger ones.
func TestCLIPurgeDeadLetters(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, nil)
	e.exec(`insert into ` + e.schema + `.dead_letters (scope, message_id, reason, created_at)
		select 'purge', 'old-' || g, 'failed', now() - interval '40 days' from generate_series(1, 12) g`)
	e.exec(`insert into ` + e.schema + `.dead_letters (scope, message_id, reason, created_at)
		select 'purge', 'young-' || g, 'failed', now() - interval '2 days' from generate_series(1, 3) g`)
	out, err := exec.Command(bin, "purge", "--dead-letters", "--older-than", "720h", "--dsn", postgresDSN(t), "--schema", e.schema).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "purged 12 dead letters older than 720h0m0s") {
		t.Fatalf("purge -dead-letters: %v\n%s", err, out)
	}
	var left int
	if err := e.pool.QueryRow(e.ctx, `select count(*) from `+e.schema+`.dead_letters where scope = 'purge'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 3 {
		t.Fatalf("%d dead letters left, want the 3 young ones", left)
	}
}
