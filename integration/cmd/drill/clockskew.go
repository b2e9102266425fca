package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The clock-skew drill: two worker processes of this program, built with a
// wall clock shifted by IDEMQ_FAKE_CLOCK_SKEW_SECONDS (the monotonic clock
// is left alone, as NTP skew does), share lease-mode records, consumption
// records and HTTP keys on the services' Postgres. Every check is made in
// database time, read from the records: a lease is never taken before its
// lease_until, always soon after it; expiry is now() + retention in the
// database; a purge by the process whose clock runs ahead deletes nothing
// unexpired, one by the process behind deletes what has expired.

const skewEnv = "IDEMQ_FAKE_CLOCK_SKEW_SECONDS"

// fakeClockSource is added to package time by the overlay: the wall-clock
// shift, read once from the environment.
const fakeClockSource = `package time

import "syscall"

// fakeWallSkew is ` + skewEnv + ` in seconds (signed), added to every
// wall-clock reading of this process: the drill's build overlay.
var fakeWallSkew = func() int64 {
	v, ok := syscall.Getenv("` + skewEnv + `")
	if !ok || v == "" {
		return 0
	}
	neg := v[0] == '-'
	if v[0] == '-' || v[0] == '+' {
		v = v[1:]
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		return -n
	}
	return n
}()
`

// buildSkewed builds this program with a time package whose Now adds
// fakeWallSkew to the wall clock: a go build -overlay of two files, the
// toolchain's own time.go with one line added and fakeClockSource.
func buildSkewed(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOROOT: %w", err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "src", "time")
	orig, err := os.ReadFile(filepath.Join(src, "time.go")) // #nosec G304 -- the toolchain's own source
	if err != nil {
		return "", err
	}
	const at = "\tsec, nsec, mono := runtimeNow()\n"
	if strings.Count(string(orig), at) != 1 {
		return "", fmt.Errorf("%s/time.go: Now does not read %q once: this Go version needs the overlay adapted", src, strings.TrimSpace(at))
	}
	patched := strings.Replace(string(orig), at, at+"\tsec += fakeWallSkew\n", 1)
	files := map[string]string{"time.go": patched, "zz_fakeclock.go": fakeClockSource}
	replace := map[string]string{}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			return "", err
		}
		replace[filepath.Join(src, name)] = p
	}
	ov, _ := json.Marshal(map[string]any{"Replace": replace})
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o600); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "drill-skewed")
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-overlay", ovPath, "-o", bin, "./cmd/drill") // #nosec G204 -- the go tool on this program
	cmd.Dir = filepath.Join(root, "integration")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -overlay: %v\n%s", err, b)
	}
	return bin, nil
}

type skewFlags struct {
	skew      time.Duration
	ttl       time.Duration
	retention time.Duration
	holdHTTP  time.Duration
}

// worker is one worker process.
type worker struct {
	name string
	skew time.Duration
	cmd  *exec.Cmd
	base string // http://addr
	done chan struct{}
}

func runClockSkew(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("clock-skew", flag.ContinueOnError)
	var f skewFlags
	fs.DurationVar(&f.skew, "skew", 5*time.Minute, "how far apart the two workers' clocks are: one runs half of it behind the database, the other half ahead")
	fs.DurationVar(&f.ttl, "ttl", 3*time.Second, "lease TTL of the lease checks")
	fs.DurationVar(&f.retention, "retention", time.Minute, "SucceededRetention of the workers' stores: the expiry and purge checks")
	fs.DurationVar(&f.holdHTTP, "hold", 2*time.Second, "how long the first HTTP request's handler runs while its copy arrives at the other worker")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.skew < 2*f.retention || f.skew < 10*time.Second {
		return errors.New("-skew must be at least 10s and twice -retention, or a clock bug could hide inside the margins")
	}
	dsn := env("TEST_POSTGRES_DSN", "")
	if dsn == "" {
		return errors.New("TEST_POSTGRES_DSN is not set: eval \"$(bash scripts/services.sh env)\" first")
	}
	dir, err := os.MkdirTemp("", "clock-skew-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	logf("building the drill with a shifted wall clock (go build -overlay)")
	bin, err := buildSkewed(ctx, dir)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "drill_skew_" + suffix()
	defer func() {
		_, _ = pool.Exec(context.WithoutCancel(ctx), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
	}()
	half := f.skew / 2
	a, err := startWorker(ctx, bin, "A", -half, schema, f, dir)
	if err != nil {
		return err
	}
	defer a.stop()
	b, err := startWorker(ctx, bin, "B", half, schema, f, dir)
	if err != nil {
		return err
	}
	defer b.stop()
	d := skewDrill{pool: pool, schema: schema, f: f}
	var checks []skewCheck
	add := func(c skewCheck) { checks = append(checks, c); logf("%-58s %s", c.what, c.result) }

	for _, w := range []*worker{a, b} {
		c, err := d.clockOffset(ctx, w)
		if err != nil {
			return err
		}
		add(c)
	}
	for i, pair := range [][2]*worker{{a, b}, {b, a}} {
		c, err := d.leaseTakeover(ctx, pair[0], pair[1], fmt.Sprintf("lease-%d", i))
		if err != nil {
			return err
		}
		add(c)
	}
	cs, err := d.retention(ctx, a, b)
	if err != nil {
		return err
	}
	for _, c := range cs {
		add(c)
	}
	c, err := d.httpKey(ctx, a, b)
	if err != nil {
		return err
	}
	add(c)

	t := table{title: fmt.Sprintf("Clock-skew drill: two workers %s apart (A %s, B +%s against the database), sharing lease records,\n"+
		"consumption records and HTTP keys on one Postgres; lease TTL %s, retention %s; every time below is database time",
		f.skew, -half, half, f.ttl, f.retention), columns: []string{"result", "holds"}}
	failed := 0
	for _, c := range checks {
		verdict := "yes"
		if !c.ok {
			verdict, failed = "NO", failed+1
		}
		t.row(c.what, c.result, verdict)
	}
	t.print()
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed: something follows a process's clock instead of the database's", failed, len(checks))
	}
	return nil
}

type skewCheck struct {
	what, result string
	ok           bool
}

type skewDrill struct {
	pool   *pgxpool.Pool
	schema string
	f      skewFlags
}

func (d skewDrill) records() string {
	return pgx.Identifier{d.schema, "consumption_records"}.Sanitize()
}

func (d skewDrill) dbNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := d.pool.QueryRow(ctx, "select clock_timestamp()").Scan(&t)
	return t, err
}

// clockOffset checks that the worker's wall clock is shifted as asked.
func (d skewDrill) clockOffset(ctx context.Context, w *worker) (skewCheck, error) {
	var got struct{ Now time.Time }
	if err := w.call(ctx, "GET", "/now", nil, &got); err != nil {
		return skewCheck{}, err
	}
	now, err := d.dbNow(ctx)
	if err != nil {
		return skewCheck{}, err
	}
	off := got.Now.Sub(now)
	ok := (off - w.skew).Abs() < 5*time.Second
	return skewCheck{what: fmt.Sprintf("worker %s's clock against the database", w.name),
		result: fmt.Sprintf("%+.1fs", off.Seconds()), ok: ok}, nil
}

type leaseRow struct {
	Status     string
	Fence      int64
	LeaseUntil *time.Time
}

func (d skewDrill) lease(ctx context.Context, id string) (leaseRow, error) {
	var r leaseRow
	err := d.pool.QueryRow(ctx, `select status, fence, lease_until from `+d.records()+` where scope = 'skew-lease' and message_id = $1`, id).
		Scan(&r.Status, &r.Fence, &r.LeaseUntil)
	return r, err
}

// leaseTakeover: holder claims id and freezes (SIGSTOP: no heartbeat);
// taker delivers the same message every 100ms. No attempt that ended
// before lease_until (database time) may take over, and the first attempt
// that began after it must.
func (d skewDrill) leaseTakeover(ctx context.Context, holder, taker *worker, id string) (skewCheck, error) {
	what := fmt.Sprintf("lease held by %s (frozen), taken by %s", holder.name, taker.name)
	held := make(chan error, 1)
	go func() { held <- holder.call(ctx, "POST", "/lease?hold=1&id="+id, nil, nil) }()
	var r leaseRow
	for i := 0; ; i++ {
		var err error
		if r, err = d.lease(ctx, id); err == nil && r.Status == "PROCESSING" && r.Fence == 1 && r.LeaseUntil != nil {
			break
		}
		if i > 300 {
			return skewCheck{}, fmt.Errorf("%s: worker %s did not claim %s (%v)", what, holder.name, id, err)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return skewCheck{}, err
		}
	}
	if err := holder.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return skewCheck{}, err
	}
	defer func() { _ = holder.cmd.Process.Signal(syscall.SIGCONT) }()
	// The last heartbeat may have landed before the stop: read lease_until now.
	if err := sleep(ctx, 100*time.Millisecond); err != nil {
		return skewCheck{}, err
	}
	r, err := d.lease(ctx, id)
	if err != nil {
		return skewCheck{}, err
	}
	until := *r.LeaseUntil
	refused, early := 0, false
	var after time.Duration
	deadline := until.Add(d.f.ttl + 30*time.Second)
	for {
		before, err := d.dbNow(ctx)
		if err != nil {
			return skewCheck{}, err
		}
		var res struct{ Outcome, Err string }
		if err := taker.call(ctx, "POST", "/lease?hold=0&id="+id, nil, &res); err != nil {
			return skewCheck{}, err
		}
		end, err := d.dbNow(ctx)
		if err != nil {
			return skewCheck{}, err
		}
		if res.Outcome == string(dedup.OutcomeProcessed) {
			early = end.Before(until)
			after = before.Sub(until)
			break
		}
		refused++
		if before.After(until.Add(time.Second)) {
			// a whole attempt began a second after expiry and was still refused
			return skewCheck{what: what, result: fmt.Sprintf("refused %d, still refused %s after lease_until (%s %s)",
				refused, before.Sub(until).Round(time.Millisecond), res.Outcome, res.Err), ok: false}, nil
		}
		if end.After(deadline) {
			return skewCheck{what: what, result: "never taken over", ok: false}, nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return skewCheck{}, err
		}
	}
	_ = holder.cmd.Process.Signal(syscall.SIGCONT)
	// The stale owner's call ends (fenced) once it runs again.
	if err := <-held; err != nil {
		return skewCheck{}, fmt.Errorf("%s: the holder's call: %w", what, err)
	}
	fin, err := d.lease(ctx, id)
	if err != nil {
		return skewCheck{}, err
	}
	ok := !early && fin.Status == "SUCCEEDED" && fin.Fence == 2
	return skewCheck{what: what, ok: ok, result: fmt.Sprintf("%d refused; taken %+.2fs after lease_until, fence %d, %s",
		refused, after.Seconds(), fin.Fence, fin.Status)}, nil
}

// retention: each worker records a message; expires_at is the database's
// commit-time now() + retention. A purge by B (ahead) deletes neither; once
// they expired in database time, a purge by A (behind) deletes both.
func (d skewDrill) retention(ctx context.Context, a, b *worker) ([]skewCheck, error) {
	var out []skewCheck
	for _, w := range []*worker{a, b} {
		if err := w.call(ctx, "POST", "/atomic?id=ret-"+w.name, nil, nil); err != nil {
			return nil, err
		}
		var gap time.Duration
		var iv time.Duration
		if err := d.pool.QueryRow(ctx, `select expires_at - updated_at from `+d.records()+` where scope = 'skew-atomic' and message_id = $1`,
			"ret-"+w.name).Scan(&iv); err != nil {
			return nil, err
		}
		gap = iv
		out = append(out, skewCheck{what: fmt.Sprintf("record by %s: expires_at - updated_at", w.name),
			result: gap.String(), ok: (gap - d.f.retention).Abs() < time.Second})
	}
	count := func() (int, error) {
		var n int
		err := d.pool.QueryRow(ctx, `select count(*) from `+d.records()+` where scope = 'skew-atomic' and message_id like 'ret-%'`).Scan(&n)
		return n, err
	}
	var purged struct{ Purged int64 }
	if err := b.call(ctx, "POST", "/purge", nil, &purged); err != nil {
		return nil, err
	}
	left, err := count()
	if err != nil {
		return nil, err
	}
	out = append(out, skewCheck{what: "purge by B (ahead) before expiry: deleted, left", result: fmt.Sprintf("%d, %d", purged.Purged, left),
		ok: purged.Purged == 0 && left == 2})
	// Wait in database time until both expired.
	for {
		var n int
		if err := d.pool.QueryRow(ctx, `select count(*) from `+d.records()+` where scope = 'skew-atomic' and message_id like 'ret-%' and expires_at > now()`).Scan(&n); err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	if err := a.call(ctx, "POST", "/purge", nil, &purged); err != nil {
		return nil, err
	}
	left, err = count()
	if err != nil {
		return nil, err
	}
	out = append(out, skewCheck{what: "purge by A (behind) after expiry: deleted, left", result: fmt.Sprintf("%d, %d", purged.Purged, left),
		ok: left == 0})
	return out, nil
}

// httpKey: a request runs on A; its copy on B is answered 409 while it
// runs, and replayed once it finished; one row.
func (d skewDrill) httpKey(ctx context.Context, a, b *worker) (skewCheck, error) {
	key := "pay-" + suffix()
	first := make(chan int, 1)
	go func() {
		code, _, _ := a.post(ctx, d.f.holdHTTP, key)
		first <- code
	}()
	// The first request's claim is not committed while its handler runs
	// (atomic HTTP mode): the worker says when its handler started.
	for i := 0; ; i++ {
		var st struct{ Started bool }
		if err := a.call(ctx, "GET", "/started?key="+key, nil, &st); err != nil {
			return skewCheck{}, err
		}
		if st.Started {
			break
		}
		if i > 500 {
			return skewCheck{}, errors.New("the first HTTP request's handler never started")
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return skewCheck{}, err
		}
	}
	during, _, err := b.post(ctx, 0, key)
	if err != nil {
		return skewCheck{}, err
	}
	firstCode := <-first
	replay, replayed, err := b.post(ctx, 0, key)
	if err != nil {
		return skewCheck{}, err
	}
	var rows int
	if err := d.pool.QueryRow(ctx, `select count(*) from `+pgx.Identifier{d.schema, "payments"}.Sanitize()+` where key = $1`, key).Scan(&rows); err != nil {
		return skewCheck{}, err
	}
	ok := firstCode == http.StatusCreated && during == http.StatusConflict && replay == http.StatusCreated && replayed && rows == 1
	return skewCheck{what: "HTTP key: A runs it; B's copy during, B's copy after; rows", ok: ok,
		result: fmt.Sprintf("%d; %d, %d replayed=%v; %d", firstCode, during, replay, replayed, rows)}, nil
}

func startWorker(ctx context.Context, bin, name string, skew time.Duration, schema string, f skewFlags, dir string) (*worker, error) {
	cmd := exec.CommandContext(ctx, bin, "clock-skew-worker", "-schema", schema, "-ttl", f.ttl.String(), "-retention", f.retention.String()) // #nosec G204 -- this program
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", skewEnv, int64(skew.Seconds())))
	logPath := filepath.Join(dir, "worker-"+name+".log")
	lf, err := os.Create(logPath) // #nosec G304 -- our temp dir
	if err != nil {
		return nil, err
	}
	cmd.Stderr = lf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &worker{name: name, skew: skew, cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				addr <- a
			}
		}
	}()
	go func() { _ = cmd.Wait(); _ = lf.Close(); close(w.done) }()
	select {
	case a := <-addr:
		w.base = "http://" + a
		return w, nil
	case <-w.done:
		b, _ := os.ReadFile(logPath) // #nosec G304 -- our temp dir
		return nil, fmt.Errorf("worker %s exited before it was ready:\n%s", name, b)
	case <-time.After(60 * time.Second):
		w.stop()
		return nil, fmt.Errorf("worker %s not ready after 60s", name)
	}
}

func (w *worker) stop() {
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	_ = w.cmd.Process.Kill()
	<-w.done
}

var skewClient = &http.Client{Timeout: 2 * time.Minute}

// call sends a control request and decodes the JSON answer into out.
func (w *worker) call(ctx context.Context, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, w.base+path, body)
	if err != nil {
		return err
	}
	resp, err := skewClient.Do(req)
	if err != nil {
		return fmt.Errorf("worker %s %s: %w", w.name, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("worker %s %s: %s: %s", w.name, path, resp.Status, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// post sends an HTTP request with an Idempotency-Key to the guarded route;
// its handler runs for hold (a header: the target and body, which the
// fingerprint covers, are the same for every copy).
func (w *worker) post(ctx context.Context, hold time.Duration, key string) (code int, replayed bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base+"/pay", strings.NewReader(`{"amount":"30.00"}`))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set(httpidem.KeyHeader, key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", "u-1")
	req.Header.Set("X-Hold", hold.String())
	resp, err := skewClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(httpidem.ReplayHeader) == "true", nil
}

// runSkewWorker is the worker process: a store on the shared schema and a
// small HTTP server (control endpoints and one guarded route). It prints
// "ready ADDR" once it listens.
func runSkewWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("clock-skew-worker", flag.ContinueOnError)
	schema := fs.String("schema", "", "the shared schema")
	ttl := fs.Duration("ttl", 3*time.Second, "lease TTL")
	retention := fs.Duration("retention", time.Minute, "SucceededRetention (at least 1m)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, os.Getenv("TEST_POSTGRES_DSN"))
	if err != nil {
		return err
	}
	defer pool.Close()
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "drill", Secret: []byte("clock-skew-drill-secret-0123456789")})
	if err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Config{Schema: *schema, Fingerprinter: fp, SucceededRetention: *retention})
	if err != nil {
		return err
	}
	if err := migrateOnce(ctx, pool, store, *schema); err != nil {
		return err
	}
	mw, err := httpidem.New(httpidem.Config{Store: store, Fingerprinter: fp, RetryWindow: *retention,
		Principal: httpidem.Header("X-User")})
	if err != nil {
		return err
	}
	payments := pgx.Identifier{*schema, "payments"}.Sanitize()
	var startedMu sync.Mutex
	started := map[string]bool{} // HTTP keys whose handler has run its statement
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /now", func(w http.ResponseWriter, _ *http.Request) { reply(w, map[string]time.Time{"now": time.Now()}) })
	mux.HandleFunc("POST /lease", func(w http.ResponseWriter, r *http.Request) {
		id, hold := r.URL.Query().Get("id"), r.URL.Query().Get("hold") == "1"
		msg := &dedup.Message{Identity: dedup.Identity{Scope: "skew-lease", MessageID: id}, Payload: []byte("x")}
		res, err := store.ProcessLeased(r.Context(), msg, func(ctx context.Context, _ *dedup.Message) error {
			if hold {
				<-ctx.Done() // until fenced (the heartbeat finds the takeover) or the request ends
				return ctx.Err()
			}
			return nil
		}, dedup.LeaseOptions{TTL: *ttl})
		reply(w, map[string]string{"outcome": string(res.Outcome), "err": fmt.Sprint(err)})
	})
	mux.HandleFunc("POST /atomic", func(w http.ResponseWriter, r *http.Request) {
		msg := &dedup.Message{Identity: dedup.Identity{Scope: "skew-atomic", MessageID: r.URL.Query().Get("id")}, Payload: []byte("x")}
		res, err := store.Process(r.Context(), msg, func(context.Context, pgx.Tx, *dedup.Message) error { return nil })
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		reply(w, map[string]string{"outcome": string(res.Outcome)})
	})
	mux.HandleFunc("GET /started", func(w http.ResponseWriter, r *http.Request) {
		startedMu.Lock()
		defer startedMu.Unlock()
		reply(w, map[string]bool{"started": started[r.URL.Query().Get("key")]})
	})
	mux.HandleFunc("POST /purge", func(w http.ResponseWriter, r *http.Request) {
		n, err := store.Purge(r.Context(), 1000)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		reply(w, map[string]int64{"purged": n})
	})
	mux.Handle("POST /pay", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hold, _ := time.ParseDuration(r.Header.Get("X-Hold"))
		tx := httpidem.FromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `insert into `+payments+` (key) values ($1)`, r.Header.Get(httpidem.KeyHeader)); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		startedMu.Lock()
		started[r.Header.Get(httpidem.KeyHeader)] = true
		startedMu.Unlock()
		time.Sleep(hold)
		w.WriteHeader(http.StatusCreated)
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Println("ready " + ln.Addr().String())
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// migrateOnce migrates the shared schema under an advisory lock (two
// workers start together) and creates the payments table.
func migrateOnce(ctx context.Context, pool *pgxpool.Pool, store *pgstore.Store, schema string) error {
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `create table if not exists `+pgx.Identifier{schema, "payments"}.Sanitize()+` (key text not null)`)
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) && pe.SQLState() == "23505" { // the other worker created it at the same moment
		return nil
	}
	return err
}
