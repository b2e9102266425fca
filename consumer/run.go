package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/grace"
)

// Run pulls deliveries from src and handles them until ctx ends, then shuts
// down gracefully (see the package doc) and closes src. Lanes (partitions) run
// in parallel, each in order. It returns nil after a shutdown caused by ctx,
// or the first Fetch error other than ctx's, after the same graceful shutdown.
//
// Before fetching, when src implements HorizonReporter, Run refuses to start
// (returning an error wrapping dedup.ErrRetentionTooShort) if the store's
// SucceededRetention is shorter than the broker's redelivery horizon, or
// (error wrapping ErrUnboundedRedelivery and ErrInvalidConfig) if the
// horizon is unbounded and Config.AcceptUnboundedRedelivery is false; the
// source is then closed. Before that, unless Config.SkipSchemaCheck is set,
// Run calls the store's read-only CheckSchema (Consumer.CheckSchema; stores
// implementing SchemaChecker, as *pgstore.Store does) and returns its error
// (e.g. wrapping pgstore.ErrSchemaOutdated) without fetching, the source
// closed.
func (c *Consumer) Run(parent context.Context, src Source) error {
	if err := c.CheckSchema(parent); err != nil {
		_ = src.Close()
		return err
	}
	if err := c.checkHorizon(parent, src); err != nil {
		_ = src.Close()
		return err
	}
	// ctx ends with parent, or when fetching fails: either way the lanes
	// stop and the shutdown grace starts.
	ctx, cancelRun := context.WithCancel(parent)
	defer cancelRun()
	// work outlives ctx by ShutdownGrace so in-flight handlers can finish.
	work, release := grace.Work(ctx, c.cfg.ShutdownGrace)
	defer release()
	waitMaintenance := c.startMaintenance(ctx)
	defer func() { cancelRun(); waitMaintenance() }()

	com := newCommitter(src, c.cfg.CommitEvery, c.cfg.CommitInterval, c.log)
	comDone := make(chan struct{})
	go func() { defer close(comDone); com.loop() }()

	lanes := map[string]chan Delivery{}
	var wg sync.WaitGroup
	var fetchErr error
	for {
		d, err := src.Fetch(ctx)
		if err != nil {
			if ctx.Err() == nil {
				fetchErr = fmt.Errorf("idemq/consumer: fetch: %w", err)
				cancelRun()
			}
			break
		}
		ch, ok := lanes[d.Lane]
		if !ok {
			ch = make(chan Delivery, c.cfg.LaneBuffer)
			lanes[d.Lane] = ch
			wg.Add(1)
			sess := c.guard.pullSession(d.Lane)
			go func() { defer wg.Done(); c.lane(ctx, work, ch, com, sess) }()
		}
		select {
		case ch <- d:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	for _, ch := range lanes {
		close(ch)
	}
	wg.Wait()
	com.close()
	<-comDone
	if err := src.Close(); err != nil && fetchErr == nil && !errors.Is(err, context.Canceled) {
		c.log.WarnContext(ctx, "idemq: close source", "err", err)
	}
	return fetchErr
}

// HorizonReporter is implemented by sources that know their broker's
// redelivery horizon (Kafka: the topic's retention.ms). A zero horizon means
// unbounded: Run then refuses to start (ErrUnboundedRedelivery) unless
// Config.AcceptUnboundedRedelivery is set, and only logs a warning if it is.
type HorizonReporter interface {
	// RedeliveryHorizon returns how long after a message was produced the
	// broker may still deliver it again (0: unbounded).
	RedeliveryHorizon(ctx context.Context) (time.Duration, error)
}

func (c *Consumer) checkHorizon(ctx context.Context, src Source) error {
	hr, ok := src.(HorizonReporter)
	if !ok {
		return nil
	}
	h, err := hr.RedeliveryHorizon(ctx)
	if err != nil {
		return fmt.Errorf("idemq/consumer: redelivery horizon: %w", err)
	}
	if h == 0 {
		if !c.cfg.AcceptUnboundedRedelivery {
			return fmt.Errorf("%w: %w: a message older than SucceededRetention %s could be processed again; set AcceptUnboundedRedelivery to accept that, or bound the topic's retention.ms",
				ErrInvalidConfig, ErrUnboundedRedelivery, c.cfg.Store.SucceededRetention())
		}
		c.log.WarnContext(ctx, "idemq: broker redelivery horizon is unbounded; records expire after SucceededRetention", "retention", c.cfg.Store.SucceededRetention())
		return nil
	}
	if err := c.cfg.Store.ValidateRetention(h); err != nil {
		return fmt.Errorf("idemq/consumer: %w", err)
	}
	return nil
}

// lane handles one lane's deliveries in order, within its crash-loop
// session sess (nil: none). After ctx ends it finishes the delivery (or
// batch) in hand (bounded by work) and drops the queued ones, which stay
// uncommitted and are redelivered.
func (c *Consumer) lane(ctx, work context.Context, ch <-chan Delivery, com *committer, sess *laneSession) {
	defer func() {
		for range ch { // drop what is queued; it stays uncommitted
		}
	}()
	if c.cfg.BatchSize > 1 {
		c.batchLane(ctx, work, ch, com, sess)
		return
	}
	for d := range ch {
		if ctx.Err() != nil {
			return
		}
		dctx, release, revoked := com.hold(ctx, d)
		if revoked {
			continue // its lane was revoked (Revocable): dropped, left to the lane's next owner
		}
		sess.received(com.laneContext(d), d.Offset)
		res, err := c.handleInPlace(dctx, work, d, sess)
		release()
		if err != nil || !res.Outcome.Acked() {
			if ctx.Err() == nil && com.revoked(d) {
				continue // revoked while retried in place: left to the lane's next owner
			}
			return // ctx ended mid-delivery: this and later deliveries stay uncommitted
		}
		com.done(d)
	}
}

// batchLane is lane in batched atomic mode: up to BatchSize deliveries,
// gathered for at most BatchWait, per transaction. The acked prefix of each
// batch is committed; the rest (from the first retry on) is retried with
// backoff, ahead of newer deliveries. Deliveries that may replay a crash run
// one at a time first (runReplays).
func (c *Consumer) batchLane(ctx, work context.Context, ch <-chan Delivery, com *committer, sess *laneSession) {
	var pending []Delivery
	b := c.newBackoff()
	open := true
	for {
		if len(pending) == 0 {
			d, ok := <-ch
			if !ok {
				return
			}
			sess.received(com.laneContext(d), d.Offset)
			pending = append(pending, d)
		}
		if open {
			timer := time.NewTimer(c.cfg.BatchWait)
		fill:
			for len(pending) < c.cfg.BatchSize {
				select {
				case d, ok := <-ch:
					if !ok {
						open = false
						break fill
					}
					sess.received(com.laneContext(d), d.Offset)
					pending = append(pending, d)
				case <-timer.C:
					break fill
				}
			}
			timer.Stop()
		}
		if pending = com.live(pending); len(pending) == 0 {
			b.Reset() // every delivery in hand was revoked (Revocable)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		n, err := c.runReplays(ctx, work, pending, com, sess)
		pending = pending[n:]
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errLaneRevoked) {
			continue // com.live drops the revoked deliveries
		}
		if err == nil && len(pending) == 0 {
			b.Reset()
			if !open {
				return
			}
			continue
		}
		var results []dedup.Result
		if err == nil {
			results, err = c.HandleBatch(work, pending)
		}
		k := 0
		if err == nil {
			for k < len(results) && results[k].Outcome != "" && results[k].Outcome.Acked() {
				com.done(pending[k])
				k++
			}
		}
		pending = pending[k:]
		if len(pending) == 0 {
			b.Reset()
			if !open {
				return
			}
			continue
		}
		if !sleep(ctx, b.NextBackOff()) {
			return
		}
	}
}

// committer batches completed deliveries into per-lane commits.
type committer struct {
	src      Source
	every    int
	interval time.Duration
	log      interface{ Warn(string, ...any) }

	revocation // set when src is Revocable

	mu        sync.Mutex
	pending   map[string]Delivery // highest completed delivery per lane, not yet committed
	committed map[string]int64    // highest committed offset per lane
	count     int
	kick      chan struct{}
	quit      chan struct{}
}

func newCommitter(src Source, every int, interval time.Duration, log interface{ Warn(string, ...any) }) *committer {
	c := &committer{src: src, every: every, interval: interval, log: log, revocation: newRevocation(src),
		pending: map[string]Delivery{}, committed: map[string]int64{},
		kick: make(chan struct{}, 1), quit: make(chan struct{})}
	c.watchRevocations()
	return c
}

// done records that d, and by lane order everything before it, is complete.
func (c *committer) done(d Delivery) {
	c.mu.Lock()
	if last, ok := c.committed[d.Lane]; !ok || d.Offset > last {
		if p, ok := c.pending[d.Lane]; !ok || d.Offset > p.Offset {
			c.pending[d.Lane] = d
		}
	}
	c.count++
	full := c.count >= c.every
	c.mu.Unlock()
	if full {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

func (c *committer) loop() {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		var reply chan struct{} // a flushNow waiting for this flush
		select {
		case <-t.C:
		case <-c.kick:
		case reply = <-c.flushReq:
		case <-c.quit:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c.flush(ctx)
			cancel()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.flush(ctx)
		cancel()
		if reply != nil {
			close(reply)
		}
	}
}

// flush commits the pending deliveries. On failure they stay pending (unless
// a later one replaced them) and are tried again at the next flush.
func (c *committer) flush(ctx context.Context) {
	c.mu.Lock()
	if len(c.pending) == 0 {
		c.mu.Unlock()
		return
	}
	batch := make([]Delivery, 0, len(c.pending))
	for _, d := range c.pending {
		batch = append(batch, d)
	}
	c.count = 0
	c.mu.Unlock()

	err := c.src.Commit(ctx, batch)

	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.log.Warn("idemq: offset commit failed; will retry", "err", err, "lanes", len(batch))
		return
	}
	for _, d := range batch {
		if last, ok := c.committed[d.Lane]; !ok || d.Offset > last {
			c.committed[d.Lane] = d.Offset
		}
		if p, ok := c.pending[d.Lane]; ok && p.Offset <= d.Offset {
			delete(c.pending, d.Lane)
		}
	}
}

func (c *committer) close() { close(c.quit) }
