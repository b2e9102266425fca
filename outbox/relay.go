package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/idemq/idemq/internal/grace"
	"github.com/idemq/idemq/internal/otelx"
	"go.opentelemetry.io/otel/trace"
)

// Relay publishes outbox rows through a Publisher and marks them published.
// Any number of relays (goroutines, processes, hosts) may run against one
// table. Build it with NewRelay and start it with Run; it is safe for
// concurrent use.
type Relay struct {
	ob  *Outbox
	pub Publisher
	cfg RelayConfig
	log *slog.Logger

	running atomic.Bool
	// serving is set once Run passed its start checks (schema, probe) and
	// its workers run; Ready reads it.
	serving atomic.Bool
	wakeMu  sync.Mutex
	wakes   []chan struct{}
	// listening is true while the LISTEN connection is up: only then may
	// idle workers wait PollInterval instead of FallbackPollInterval.
	listening atomic.Bool

	// cursor is where the next key walk starts: (topic, key) of the last key
	// visited; the zero value is the start.
	cursorMu  sync.Mutex
	cursorTop string
	cursorKey []byte

	batches, claimed, published, failed, parked, purged, dbErrors, listenLost atomic.Int64
	unavailable                                                               atomic.Int64

	// brk pauses publishing while the broker is unavailable.
	brk *breaker

	// tracer makes the producer spans (relay_trace.go); tracing says
	// whether they can record.
	tracer  trace.Tracer
	tracing otelx.Tracing

	// testSignals are set only by this package's tests.
	testSignals testSignals
}

// NewRelay validates cfg and returns a relay for ob's table publishing
// through pub. It does not touch the database. Errors: ErrNoPool when ob has
// no pool; errors wrapping ErrInvalidConfig (among them: ob's
// Config.TransactionPooler set without cfg.DisableListen).
func NewRelay(ob *Outbox, pub Publisher, cfg RelayConfig) (*Relay, error) {
	if ob == nil || pub == nil {
		return nil, fmt.Errorf("%w: NewRelay needs a non-nil ob (*Outbox) and pub (Publisher)", ErrInvalidConfig)
	}
	if ob.pool == nil {
		return nil, ErrNoPool
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if ob.cfg.TransactionPooler && !cfg.DisableListen {
		return nil, fmt.Errorf("%w: the outbox's Config.TransactionPooler is set and LISTEN needs a server session, "+
			"which a transaction pooler does not keep: set RelayConfig.DisableListen (the relay polls every PollInterval)", ErrInvalidConfig)
	}
	r := &Relay{ob: ob, pub: pub, cfg: cfg, log: cfg.Logger.With("relay", cfg.Name, "outbox", ob.q.table)}
	r.brk = newBreaker(cfg.OutageBackoffInitial, cfg.OutageBackoffMax, r.log)
	r.tracer = cfg.TracerProvider.Tracer("github.com/idemq/idemq/outbox", otelx.TracerOptions()...)
	r.tracing = otelx.NewTracing(cfg.TracerProvider)
	return r, nil
}

// Config returns the relay configuration with defaults applied.
func (r *Relay) Config() RelayConfig { return r.cfg }

// RelayStats are a relay's counters since NewRelay.
type RelayStats struct {
	// Batches counts claim transactions that claimed at least one row.
	Batches int64
	// Claimed counts rows claimed (a row claimed again after a failure or a
	// lost mark counts again).
	Claimed int64
	// Published counts rows published and marked.
	Published int64
	// Failed counts failed publishes recorded (each schedules a retry or
	// parks the row): row errors only, see Unavailable.
	Failed int64
	// Unavailable counts publishes that failed because the broker was
	// unavailable (IsUnavailable): not attempts, nothing recorded on the
	// row; each batch with one pauses publishing (BreakerOpen).
	Unavailable int64
	// BreakerOpen is true while publishing is paused because the broker is
	// unavailable: workers claim no batch but a probe every
	// OutageBackoffInitial, doubling up to OutageBackoffMax.
	BreakerOpen bool
	// Outages counts the times publishing was paused (the breaker opened),
	// however many probes failed during each.
	Outages int64
	// Parked counts rows this relay parked.
	Parked int64
	// Purged counts published rows deleted by retention.
	Purged int64
	// DBErrors counts batches lost to a database error (the claim, the mark
	// or the commit failed); their rows are published again later.
	DBErrors int64
	// ListenLost counts losses of the LISTEN connection (a connection that
	// failed, or the first one that could not be made): each time the
	// workers fell back to polling every FallbackPollInterval until a new
	// one was up. Failed reconnects during one loss count once.
	ListenLost int64
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	open, outages := r.brk.state()
	return RelayStats{Batches: r.batches.Load(), Claimed: r.claimed.Load(), Published: r.published.Load(),
		Failed: r.failed.Load(), Parked: r.parked.Load(), Purged: r.purged.Load(), DBErrors: r.dbErrors.Load(),
		ListenLost: r.listenLost.Load(), Unavailable: r.unavailable.Load(), BreakerOpen: open, Outages: outages}
}

// ErrRunning is returned by Run when the relay is already running.
var ErrRunning = errors.New("idemq/outbox: relay already running")

// Run publishes rows until ctx ends, then shuts down gracefully: no new batch
// is claimed, in-flight batches get RelayConfig.ShutdownGrace to publish and
// mark, the LISTEN connection is closed. It returns nil after a shutdown
// caused by ctx. It returns an error at once if the outbox schema is missing
// or outdated (Outbox.CheckSchema, unless RelayConfig.SkipSchemaCheck; the
// error matches ErrSchemaMissing / ErrSchemaOutdated), if the outbox table
// cannot be read (database unreachable), or ErrRunning. Database and
// broker errors while running are logged, retried with backoff and counted
// (Stats), never returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	if !r.cfg.SkipSchemaCheck {
		if err := r.ob.CheckSchema(ctx); err != nil {
			return fmt.Errorf("idemq/outbox: relay: %w", err)
		}
	}
	if _, err := r.ob.pool.Exec(ctx, r.ob.q.probeSQL); err != nil {
		return fmt.Errorf("idemq/outbox: relay: outbox table %s: %w", r.ob.q.table, err)
	}
	r.serving.Store(true)
	defer r.serving.Store(false)

	// work outlives ctx by ShutdownGrace so in-flight batches can finish.
	work, release := grace.Work(ctx, r.cfg.ShutdownGrace)
	defer release()

	r.wakeMu.Lock()
	r.wakes = make([]chan struct{}, r.cfg.Workers)
	for i := range r.wakes {
		r.wakes[i] = make(chan struct{}, 1)
	}
	wakes := r.wakes
	r.wakeMu.Unlock()

	var wg sync.WaitGroup
	for _, w := range wakes {
		wg.Add(1)
		go func() { defer wg.Done(); r.worker(ctx, work, w) }()
	}
	if !r.cfg.DisableListen {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(ctx) }()
	}
	if !r.cfg.DisablePurge {
		wg.Add(1)
		go func() { defer wg.Done(); r.purgeLoop(ctx) }()
	}
	r.log.InfoContext(ctx, "idemq: relay started", "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "listen", !r.cfg.DisableListen)
	wg.Wait()
	s := r.Stats()
	r.log.InfoContext(ctx, "idemq: relay stopped", "published", s.Published, "failed", s.Failed, "parked", s.Parked)
	return nil
}

// Wake makes idle workers of a running relay look for rows now, as a
// notification would. It never blocks.
func (r *Relay) Wake() {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	for _, w := range r.wakes {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

func (r *Relay) worker(ctx, work context.Context, wake <-chan struct{}) {
	errBackoff := &backoff.ExponentialBackOff{
		InitialInterval:     100 * time.Millisecond,
		RandomizationFactor: 0.2,
		Multiplier:          2,
		MaxInterval:         5 * time.Second,
	}
	errBackoff.Reset()
	var nextRetry time.Time
	for ctx.Err() == nil {
		ok, probe, pause := r.brk.admit(time.Now(), r.idleWait())
		if !ok {
			// The broker is unavailable: wait out the breaker's delay (a
			// wake-up only makes the worker ask again).
			r.sleep(ctx, wake, pause)
			continue
		}
		res, err := r.runBatch(work)
		r.brk.done(time.Now(), probe, res, err != nil)
		wait := r.idleWait()
		switch {
		case err != nil:
			r.dbErrors.Add(1)
			wait = errBackoff.NextBackOff()
			r.log.WarnContext(ctx, "idemq: relay batch failed; its rows will be published again", "err", err, "retry_in", wait)
		case res.Unavailable > 0:
			errBackoff.Reset()
			continue // the breaker is open: admit says how long to wait
		case res.Claimed > 0:
			errBackoff.Reset()
			if res.RetryIn > 0 {
				if t := time.Now().Add(res.RetryIn); nextRetry.IsZero() || t.Before(nextRetry) {
					nextRetry = t
				}
			}
			continue // more rows may be waiting
		default:
			errBackoff.Reset()
		}
		if !nextRetry.IsZero() {
			if d := time.Until(nextRetry); d < wait {
				wait = max(d, time.Millisecond)
			}
		}
		if r.sleep(ctx, wake, wait) && !nextRetry.IsZero() && !time.Now().Before(nextRetry) {
			nextRetry = time.Time{}
		}
	}
}

// sleep waits d, or until a wake-up or the end of ctx; it reports whether
// the whole of d passed.
func (r *Relay) sleep(ctx context.Context, wake <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
		return true
	}
	return false
}

// idleWait is how long an idle worker waits for a wake-up before it looks
// for rows on its own: PollInterval while notifications can wake it (the
// LISTEN connection is up, or LISTEN is off and polling is all there is),
// FallbackPollInterval while the LISTEN connection is down.
func (r *Relay) idleWait() time.Duration {
	if r.cfg.DisableListen || r.listening.Load() {
		return r.cfg.PollInterval
	}
	return r.cfg.FallbackPollInterval
}

// listen holds a LISTEN connection and wakes the workers on each
// notification, reconnecting with backoff in the background. When the
// connection is lost (or cannot be made at start) the workers are woken at
// once and poll every FallbackPollInterval until a new one is up; after
// every (re)connect they are woken once, in case notifications were missed
// meanwhile. Each loss logs one warning and each return one info line;
// failed reconnects in between are debug lines.
func (r *Relay) listen(ctx context.Context) {
	b := &backoff.ExponentialBackOff{InitialInterval: 200 * time.Millisecond, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: 10 * time.Second}
	b.Reset()
	down := false
	for ctx.Err() == nil {
		start := time.Now()
		err := r.listenOnce(ctx, func() {
			if down {
				down = false
				r.log.InfoContext(ctx, "idemq: relay LISTEN connection back; polling every PollInterval again", "poll_every", r.cfg.PollInterval)
			}
		})
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			b.Reset()
		}
		d := b.NextBackOff()
		if down {
			r.log.DebugContext(ctx, "idemq: relay LISTEN reconnect failed; still polling", "err", err, "retry_in", d)
		} else {
			// Fall back to polling now: the workers may be waiting out a
			// long PollInterval, and rows committed from here on wake
			// nobody.
			down = true
			r.listenLost.Add(1)
			r.Wake()
			r.log.WarnContext(ctx, "idemq: relay LISTEN connection lost; polling meanwhile", "err", err,
				"poll_every", r.cfg.FallbackPollInterval, "retry_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// listenOnce makes the LISTEN connection, calls up once it listens, and
// wakes the workers on each notification until the connection fails.
func (r *Relay) listenOnce(ctx context.Context, up func()) error {
	if h := r.testSignals.beforeListen; h != nil {
		if err := h(ctx); err != nil {
			return fmt.Errorf("idemq/outbox: before-listen hook: %w", err)
		}
	}
	pc, err := r.ob.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A LISTENing connection never goes back to the pool.
	conn := pc.Hijack()
	defer func() {
		r.listening.Store(false)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, r.ob.q.listenSQL); err != nil {
		return err
	}
	r.listening.Store(true)
	up()
	r.Wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		r.Wake()
	}
}

func (r *Relay) purgeLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := r.ob.Purge(ctx, r.cfg.Retention, r.cfg.PurgeBatch)
		r.purged.Add(n)
		if err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "idemq: outbox purge failed; will retry", "err", err)
		} else if n > 0 {
			r.log.DebugContext(ctx, "idemq: outbox purged", "rows", n)
		}
	}
}

// BatchResult reports one claim transaction.
type BatchResult struct {
	// Claimed is how many rows the transaction took (heads and followers).
	Claimed int
	// Published is how many were published and marked.
	Published int
	// Failed is how many publishes failed and were recorded.
	Failed int
	// Parked is how many of the failed rows were parked.
	Parked int
	// Unavailable is how many publishes failed because the broker was
	// unavailable (IsUnavailable): those rows are not counted in Failed,
	// get no attempt and no retry time, and are claimed again first.
	Unavailable int
	// RetryIn is the shortest retry delay given to a failed row (0 if none).
	RetryIn time.Duration
}

// RunOnce claims one batch, publishes it and marks it, in one transaction,
// and reports what happened; a zero BatchResult means nothing was ready (no
// unpublished row whose time has come, or every ready key held by another
// relay). It is what each worker of Run does in a loop, for callers that
// schedule the relay themselves: a one-shot drain from cron or a serverless
// function (`idemq relay --once` calls it until a batch claims nothing), or a
// benchmark. It may run concurrently with Run and other relays, needs no Run,
// and does not purge. Failed publishes are recorded on their rows (retry
// time, attempts, parking) exactly as under Run. A non-nil error means the
// batch was lost to a database error (the claim, the mark or the commit
// failed): its rows will be published again; it is counted in
// RelayStats.DBErrors.
func (r *Relay) RunOnce(ctx context.Context) (BatchResult, error) {
	res, err := r.runBatch(ctx)
	if err != nil {
		r.dbErrors.Add(1)
	}
	return res, err
}

// item is one claimed row.
type item struct {
	seq      int64
	attempts int
	dueAt    time.Time // available_at: since when the row may be published
	env      Envelope
}

type failure struct {
	item
	err error
}

// follower is an unpublished row behind a claimed head; ready is false when
// it must hold back its key (delayed, or parked).
type follower struct {
	item
	ready bool
}

// buildChains returns one chain per head: the head, then the followers of
// its key (given in seq order), ending before the first follower that is not
// ready. Keyless heads have no followers.
func buildChains(heads []item, followers []follower) [][]item {
	chains := make([][]item, len(heads))
	byKey := make(map[string]int, len(heads))
	for i, h := range heads {
		chains[i] = []item{h}
		if h.env.Key != nil {
			byKey[chainKey(h.env.Topic, h.env.Key)] = i
		}
	}
	closed := map[int]bool{}
	for _, f := range followers {
		i, ok := byKey[chainKey(f.env.Topic, f.env.Key)]
		switch {
		case !ok || closed[i] || f.seq <= chains[i][len(chains[i])-1].seq:
		case !f.ready:
			closed[i] = true
		default:
			chains[i] = append(chains[i], f.item)
		}
	}
	return chains
}

func chainKey(topic string, key []byte) string { return topic + "\x00" + string(key) }

// publishChains publishes chains and reports which rows were acknowledged
// and which failed. A failed row ends its chain for this batch (the rest wait
// for it). Rows not acknowledged because ctx ended are in neither result (a
// shutdown is not an attempt). A ChainPublisher gets all chains in one call;
// any other Publisher gets rounds: round k sends the k-th row of every chain
// whose earlier rows were all acknowledged, so one call never holds two rows
// of a key, and a key's row is sent only after its previous row was
// acknowledged. Before each round after the first, claimHolds (when not nil)
// checks that the claim still stands; when it does not (the claim
// transaction's connection is gone, so another relay may claim the rows),
// no further round is sent and the rows not sent are in neither result.
func publishChains(ctx context.Context, pub Publisher, chains [][]item, timeout time.Duration, claimHolds func() error) (published []item, failed []failure) {
	if cp, ok := pub.(ChainPublisher); ok {
		return publishChainsAtOnce(ctx, cp, chains, timeout)
	}
	pos := make([]int, len(chains))
	active := make([]int, 0, len(chains))
	for i, c := range chains {
		if len(c) > 0 {
			active = append(active, i)
		}
	}
	batch := make([]Envelope, 0, len(active))
	for round := 0; len(active) > 0 && ctx.Err() == nil; round++ {
		if round > 0 && claimHolds != nil && claimHolds() != nil {
			break // the mark fails on the same connection and the batch counts as lost
		}
		batch = batch[:0]
		for _, c := range active {
			batch = append(batch, chains[c][pos[c]].env)
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		errs := perEnvelope(pctx, pub, batch)
		cancel()
		next := active[:0]
		for j, c := range active {
			it := chains[c][pos[c]]
			switch {
			case errs[j] == nil:
				published = append(published, it)
				if pos[c]++; pos[c] < len(chains[c]) {
					next = append(next, c)
				}
			case ctx.Err() != nil:
				// Our own shutdown, not the broker's fault: not an attempt.
			default:
				failed = append(failed, failure{item: it, err: errs[j]})
			}
		}
		active = next
	}
	return published, failed
}

func publishChainsAtOnce(ctx context.Context, cp ChainPublisher, chains [][]item, timeout time.Duration) (published []item, failed []failure) {
	envs := make([][]Envelope, len(chains))
	for i, c := range chains {
		envs[i] = make([]Envelope, len(c))
		for j, it := range c {
			envs[i][j] = it.env
		}
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	res := perChain(pctx, cp, envs)
	cancel()
	for i, c := range chains {
		n := min(max(res[i].Acked, 0), len(c))
		published = append(published, c[:n]...)
		if n < len(c) && ctx.Err() == nil {
			err := res[i].Err
			if err == nil {
				err = errors.New("idemq/outbox: publisher acknowledged part of a chain without an error")
			}
			failed = append(failed, failure{item: c[n], err: err})
		}
	}
	return published, failed
}

// jitter draws the random factor of retryDelay, in [0, 1).
func jitter() float64 { return rand.Float64() }

// retryDelay is the delay after the attempt-th failed publish of a row
// (attempt >= 1): initial·2^(attempt-1), capped at maxDelay, times a jitter
// factor in [0.8, 1.2) drawn from rnd in [0, 1), never above maxDelay.
func retryDelay(attempt int, initial, maxDelay time.Duration, rnd float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(initial) * math.Pow(2, float64(min(attempt-1, 62)))
	if d > float64(maxDelay) {
		d = float64(maxDelay)
	}
	d *= 0.8 + 0.4*rnd
	if d > float64(maxDelay) {
		d = float64(maxDelay)
	}
	return time.Duration(d)
}
