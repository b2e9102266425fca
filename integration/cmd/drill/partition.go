package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
)

// The partition drill: the consumer, the relay and the HTTP middleware
// reach Postgres through Shopify's toxiproxy, run in this process, and
// each network fault is switched on for a window while they work: latency,
// a cut (every connection reset), a black hole (bytes accepted and dropped,
// no RST, no FIN: a half-open connection) and a slow close. After each
// fault the drill measures how long the work took to flow again; at the
// end, from the database and the topic, that every message and request took
// effect once.

type partFault struct {
	name    string
	toxics  []string // toxiproxy toxic JSON
	recover time.Duration
	hung    bool
	stuck   string // the components that did nothing within the bound
	// began and ended delimit the fault; cut and longest are the statements
	// begun within it that failed before it ended (the black hole: cut by
	// the statement timeout or the handler's deadline) and the longest of
	// them.
	began, ended time.Time
	cut          int
	longest      time.Duration
	// probe sends one claim (store.Process on a context without a
	// deadline) into the fault; probeErr and probeTook are its answer.
	probe     bool
	probeErr  error
	probeTook time.Duration
}

func runPartition(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("partition", flag.ContinueOnError)
	minMessages := fs.Int("messages", 2000, "messages consumed at least (atomic mode; each writes an outbox row the relay publishes); more are produced while faults remain")
	minRequests := fs.Int("requests", 200, "HTTP requests at least, each retried with its key until it is answered; more are sent while faults remain")
	window := fs.Duration("window", 3*time.Second, "how long each fault lasts")
	bound := fs.Duration("bound", 90*time.Second, "work must flow again within this long after a fault ends, or the drill reports a hang")
	stmtTimeout := fs.Duration("statement-timeout", time.Second, "pgstore.Config.StatementTimeout and outbox.RelayConfig.StatementTimeout, and the consumer's MaxHandlerDuration: a statement on a black-holed connection must fail within it (keep it below -window)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dsn := env("TEST_POSTGRES_DSN", "")
	if dsn == "" {
		return errors.New("TEST_POSTGRES_DSN is not set: eval \"$(bash scripts/services.sh env)\" first")
	}
	direct, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer direct.Close()
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", u.Host)
	if err := proxy.Start(); err != nil {
		return err
	}
	defer proxy.Stop()
	viaProxy := *u
	viaProxy.Host = proxy.Listen
	cfg, err := pgxpool.ParseConfig(viaProxy.String())
	if err != nil {
		return err
	}
	cfg.MaxConns = 10
	waits := &waitTracer{}
	cfg.ConnConfig.Tracer = waits
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	sfx := suffix()
	schema := "drill_part_" + sfx
	defer func() {
		_, _ = direct.Exec(context.WithoutCancel(ctx), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
	}()
	s := pgx.Identifier{schema}.Sanitize()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	setup, err := setupStoreOutbox(ctx, pool, "partition", schema, 10, logger)
	if err != nil {
		return err
	}
	fp, ob := setup.fp, setup.ob
	storeCfg := setup.store.Config()
	storeCfg.StatementTimeout = *stmtTimeout
	store, err := pgstore.New(pool, storeCfg)
	if err != nil {
		return err
	}
	probeID, err := dedup.NewIdentity("part-probe", "probe-"+sfx, "", "")
	if err != nil {
		return err
	}
	probeMsg := &dedup.Message{Identity: probeID, Payload: []byte(`{}`), Topic: "probe"}
	if _, err := direct.Exec(ctx, `create table `+s+`.effects (n bigint generated always as identity primary key, source text not null, id text not null)`); err != nil {
		return err
	}
	brokers := kafkaBrokers()
	in, out := "drill-part-"+sfx, "drill-part-out-"+sfx
	if err := kafkaadapter.EnsureTopics(ctx, brokers, 4, in, out); err != nil {
		return err
	}
	// A fifth of the messages first; the rest while the faults run, so the
	// consumer and the relay have work after each fault.
	if err := produceRange(ctx, brokers, in, "m", 0, *minMessages/5, 20); err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var faultsDone atomic.Bool // the producer and the HTTP client stop adding work once set
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	cons, err := consumer.New(consumer.Config{Scope: "part", Store: store, Logger: logger,
		RetryInitial: 50 * time.Millisecond, RetryMax: time.Second, MaxHandlerDuration: *stmtTimeout,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
			if _, err := tx.Exec(ctx, `insert into `+s+`.effects (source, id) values ('kafka', $1)`, msg.Identity.MessageID); err != nil {
				return err
			}
			_, err := ob.Add(ctx, tx, outbox.Message{Topic: out, Key: msg.Key, Payload: msg.Payload, CausationID: outbox.Causation(msg)})
			return err
		}})
	if err != nil {
		return err
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Logger: logger, Reader: kafka.ReaderConfig{
		Brokers: brokers, GroupID: "part-" + sfx, Topic: in, MaxWait: 200 * time.Millisecond}})
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := cons.Run(runCtx, src); err != nil && !errors.Is(err, context.Canceled) {
			errs <- fmt.Errorf("consumer: %w", err)
		}
	}()
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	relay, err := outbox.NewRelay(ob, pub, outbox.RelayConfig{Name: "drill-relay", PollInterval: 200 * time.Millisecond,
		RetryInitial: 100 * time.Millisecond, RetryMax: time.Second, StatementTimeout: *stmtTimeout, Logger: logger})
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := relay.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			errs <- fmt.Errorf("relay: %w", err)
		}
	}()
	// The HTTP side: the middleware on the proxied pool, a client that
	// retries every request with its key until it gets a final answer.
	mw, err := httpidem.New(httpidem.Config{Store: store, Fingerprinter: fp, Principal: httpidem.Header("X-User")})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /pay", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := httpidem.FromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `insert into `+s+`.effects (source, id) values ('http', $1)`, r.Header.Get(httpidem.KeyHeader)); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	api := httptest.NewServer(mux)
	defer api.Close()
	var answered, sent, httpAttempts, longest atomic.Int64 // longest: the slowest attempt, in ns
	var statusMu sync.Mutex
	statuses := map[int]int{} // HTTP answers by status
	wg.Add(1)
	go func() {
		defer wg.Done()
		cl := &http.Client{Timeout: 30 * time.Second}
		for i := 0; (i < *minRequests || !faultsDone.Load()) && runCtx.Err() == nil; i++ {
			sent.Store(int64(i + 1))
			key := fmt.Sprintf("req-%d", i)
			for runCtx.Err() == nil {
				httpAttempts.Add(1)
				began := time.Now()
				req, _ := http.NewRequestWithContext(runCtx, http.MethodPost, api.URL+"/pay", strings.NewReader(`{"n":1}`))
				req.Header.Set(httpidem.KeyHeader, key)
				req.Header.Set("X-User", "u-1")
				req.Header.Set("Content-Type", "application/json")
				resp, err := cl.Do(req)
				if d := time.Since(began); d > time.Duration(longest.Load()) {
					longest.Store(int64(d))
				}
				if err == nil {
					statusMu.Lock()
					statuses[resp.StatusCode]++
					statusMu.Unlock()
					_ = resp.Body.Close()
					if resp.StatusCode == http.StatusCreated {
						answered.Add(1)
						break
					}
				}
				_ = sleep(runCtx, 100*time.Millisecond)
			}
			_ = sleep(runCtx, 30*time.Millisecond)
		}
	}()
	// The producer and the HTTP client go on while faults remain, so that
	// every component has work after each fault; the counts below are
	// what they produced and sent.
	var produced atomic.Int64
	produced.Store(int64(*minMessages / 5))
	producerDone := make(chan error, 1)
	go func() {
		per := int64(max(1, (*minMessages-*minMessages/5)/40))
		for lo := produced.Load(); lo < int64(*minMessages) || !faultsDone.Load(); lo += per {
			if err := produceRange(runCtx, brokers, in, "m", int(lo), int(lo+per), 20); err != nil {
				producerDone <- err
				return
			}
			produced.Store(lo + per)
			if sleep(runCtx, 500*time.Millisecond) != nil {
				producerDone <- runCtx.Err()
				return
			}
		}
		producerDone <- nil
	}()
	stopAll := func() { cancel(); wg.Wait() }
	defer stopAll()

	// progress is what each component has done, from the database and the
	// client: consumer effects, relayed rows, HTTP answers.
	progress := func() [3]int {
		var k, p int
		qctx, c := context.WithTimeout(ctx, 5*time.Second)
		defer c()
		if err := direct.QueryRow(qctx, `select (select count(*) from `+s+`.effects where source = 'kafka'),
  (select count(*) from `+s+`.outbox where published_at is not null)`).Scan(&k, &p); err != nil {
			return [3]int{-1, -1, -1}
		}
		return [3]int{k, p, int(answered.Load())}
	}
	names := [3]string{"consumer", "relay", "HTTP"}
	faults := []partFault{
		{name: "latency 300ms each way", toxics: []string{
			`{"name":"lat_down","type":"latency","stream":"downstream","attributes":{"latency":300}}`,
			`{"name":"lat_up","type":"latency","stream":"upstream","attributes":{"latency":300}}`}},
		{name: "cut (every connection reset)", toxics: []string{
			`{"name":"reset","type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`}},
		{name: "black hole (half-open, no RST)", probe: true, toxics: []string{
			`{"name":"hole_down","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`,
			`{"name":"hole_up","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`}},
		{name: "slow close 2s", toxics: []string{
			`{"name":"slow","type":"slow_close","stream":"downstream","attributes":{"delay":2000}}`}},
	}
	for i := range faults {
		f := &faults[i]
		// Every component makes progress first.
		p0 := progress()
		for p := progress(); p[0] <= p0[0] || p[1] <= p0[1] || p[2] <= p0[2]; p = progress() {
			if err := checkErrs(errs); err != nil {
				return err
			}
			if err := sleep(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		}
		began := time.Now()
		for _, t := range f.toxics {
			if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(t)); err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
		}
		var probeDone chan struct{}
		if f.probe {
			// A claim sent into the fault on a context without a deadline,
			// as the consumer's: only the store's StatementTimeout ends it.
			probeDone = make(chan struct{})
			go func() {
				defer close(probeDone)
				t0 := time.Now()
				_, f.probeErr = store.Process(context.WithoutCancel(ctx), probeMsg, func(context.Context, pgx.Tx, *dedup.Message) error { return nil })
				f.probeTook = time.Since(t0)
			}()
		}
		if err := sleep(ctx, *window); err != nil {
			return err
		}
		proxy.Toxics.ResetToxics(ctx)
		ended := time.Now()
		f.began, f.ended = began, ended
		if probeDone != nil {
			select {
			case <-probeDone:
			case <-time.After(*bound):
				return fmt.Errorf("%s: a claim sent into it still waits %s after it ended", f.name, *bound)
			}
		}
		p1 := progress()
		// Each component must do something again; the last one to do so
		// is the recovery time.
		var stuck []string
		for {
			p := progress()
			stuck = stuck[:0]
			for c := range names {
				if p[c] <= p1[c] {
					stuck = append(stuck, names[c])
				}
			}
			if len(stuck) == 0 {
				break
			}
			if time.Since(ended) > *bound {
				f.hung, f.stuck = true, strings.Join(stuck, ", ")
				break
			}
			if err := checkErrs(errs); err != nil {
				return err
			}
			if err := sleep(ctx, 20*time.Millisecond); err != nil {
				return err
			}
		}
		f.recover = time.Since(ended)
		if f.hung {
			logf("%-32s %s did nothing for %s after it ended", f.name, f.stuck, bound)
		} else {
			logf("%-32s every component working again %s after it ended", f.name, f.recover.Round(time.Millisecond))
		}
	}
	faultsDone.Store(true)
	if err := <-producerDone; err != nil {
		return err
	}
	messages, requests := int(produced.Load()), 0 // requests: once the client is done
	// Everything done: messages applied, outbox published, requests answered.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var applied, pending int
		if err := direct.QueryRow(ctx, `select (select count(distinct id) from `+s+`.effects where source = 'kafka'),
  (select count(*) from `+s+`.outbox where published_at is null)`).Scan(&applied, &pending); err != nil {
			return fmt.Errorf("counting: %w", err)
		}
		if applied >= messages && pending == 0 && answered.Load() >= sent.Load() {
			break
		}
		if time.Now().After(deadline) {
			statusMu.Lock()
			byStatus := fmt.Sprint(statuses)
			statusMu.Unlock()
			return fmt.Errorf("not done 3 minutes after the last fault: %d of %d messages applied, %d outbox rows pending, %d of %d requests answered (answers by status: %s)",
				applied, messages, pending, answered.Load(), sent.Load(), byStatus)
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	stopAll()
	requests = int(sent.Load())

	var kRows, kDistinct, hRows, hDistinct int
	if err := direct.QueryRow(ctx, `select
  (select count(*) from `+s+`.effects where source = 'kafka'), (select count(distinct id) from `+s+`.effects where source = 'kafka'),
  (select count(*) from `+s+`.effects where source = 'http'), (select count(distinct id) from `+s+`.effects where source = 'http')`).
		Scan(&kRows, &kDistinct, &hRows, &hDistinct); err != nil {
		return err
	}
	rc, err := checkRelay(ctx, direct, s+`.outbox`, brokers, out)
	if err != nil {
		return err
	}

	t := table{title: fmt.Sprintf("Partition drill: the consumer (atomic, %d messages), the relay and the HTTP middleware (%d requests, retried\n"+
		"with their key) reach Postgres through toxiproxy; each fault lasts %s; recovery = the first new effect or publish after it ends", messages, requests, *window),
		columns: []string{"value"}}
	hung := 0
	var undetected []string
	for i := range faults {
		f := &faults[i]
		v := f.recover.Round(time.Millisecond).String()
		if f.hung {
			v, hung = f.stuck+" HUNG > "+bound.String(), hung+1
		}
		t.row("recovery after "+f.name, v)
		f.cut, f.longest = waits.failedWithin(f.began, f.ended)
	}
	// The black hole (the third fault): statements sent into it hang until
	// something cuts them; idemq's bounds must, within the timeout.
	hole := faults[2]
	probe := "ok"
	if hole.probeErr == nil {
		probe = "answered: not cut"
	}
	t.row(fmt.Sprintf("black hole: a claim sent into it failed after (StatementTimeout %s)", *stmtTimeout),
		fmt.Sprintf("%s (%s)", hole.probeTook.Round(time.Millisecond), probe))
	t.row("black hole: statements and dials begun in it that failed / longest wait",
		fmt.Sprintf("%d / %s", hole.cut, hole.longest.Round(time.Millisecond)))
	// The claim must fail, within the timeout plus two seconds for a busy
	// machine to run the timer; the tracer's counts are for the reader
	// (they include the HTTP statements, bounded by httpidem's Timeout).
	if hole.probeErr == nil || hole.probeTook > *stmtTimeout+2*time.Second {
		undetected = append(undetected, fmt.Sprintf("the claim sent into it answered %v after %s; %d statements cut, the longest after %s (bound %s)",
			hole.probeErr, hole.probeTook.Round(time.Millisecond), hole.cut, hole.longest.Round(time.Millisecond), *stmtTimeout))
	}
	t.row("consumer: effect rows / distinct / messages", fmt.Sprintf("%d / %d / %d", kRows, kDistinct, messages))
	t.row("HTTP: effect rows / distinct / requests (attempts)", fmt.Sprintf("%d / %d / %d (%d)", hRows, hDistinct, requests, httpAttempts.Load()))
	t.row("HTTP: slowest attempt (client timeout 30s)", time.Duration(longest.Load()).Round(time.Millisecond).String())
	t.row("relay: outbox rows / on the topic / extra copies", fmt.Sprintf("%d / %d / %d", rc.outboxRows, rc.outboxRows-rc.missing, rc.copies))
	t.row("relay: per-key order faults / published without a row", fmt.Sprintf("%d / %d", rc.orderFaults, rc.phantoms))
	dups, lost := (kRows-kDistinct)+(hRows-hDistinct), (messages-kDistinct)+(requests-hDistinct)+rc.missing+rc.unpublished
	t.row("duplicate effects", fmt.Sprint(dups))
	t.row("lost", fmt.Sprint(lost))
	t.print()
	if hung > 0 || dups > 0 || lost > 0 || rc.orderFaults > 0 || rc.phantoms > 0 {
		return fmt.Errorf("%d faults hung, %d duplicate effects, %d lost, %d order faults, %d published without a row", hung, dups, lost, rc.orderFaults, rc.phantoms)
	}
	if len(undetected) > 0 {
		return fmt.Errorf("the black-holed connections were not detected within the statement timeout: %s", strings.Join(undetected, "; "))
	}
	return nil
}

// waitTracer records, for every statement and batch of the proxied pool
// that failed, when it began and how long it waited.
type waitTracer struct {
	mu     sync.Mutex
	failed []struct {
		began time.Time
		took  time.Duration
	}
}

type waitStart struct{}

func (w *waitTracer) start(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitStart{}, time.Now())
}

func (w *waitTracer) end(ctx context.Context, err error) {
	began, ok := ctx.Value(waitStart{}).(time.Time)
	if !ok || err == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failed = append(w.failed, struct {
		began time.Time
		took  time.Duration
	}{began, time.Since(began)})
}

// failedWithin returns how many failed statements and dials began in
// [from, to), and the longest wait among them.
func (w *waitTracer) failedWithin(from, to time.Time) (n int, longest time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.failed {
		if !f.began.Before(from) && f.began.Before(to) {
			n++
			longest = max(longest, f.took)
		}
	}
	return n, longest
}

// TraceQueryStart implements pgx.QueryTracer.
func (w *waitTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return w.start(ctx)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (w *waitTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	w.end(ctx, d.Err)
}

// TraceBatchStart implements pgx.BatchTracer.
func (w *waitTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return w.start(ctx)
}

// TraceBatchQuery implements pgx.BatchTracer.
func (w *waitTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceConnectStart implements pgx.ConnectTracer.
func (w *waitTracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return w.start(ctx)
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (w *waitTracer) TraceConnectEnd(ctx context.Context, d pgx.TraceConnectEndData) {
	w.end(ctx, d.Err)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (w *waitTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	w.end(ctx, d.Err)
}
