package rocketmqadapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
)

// Defaults of Config.
const (
	// DefaultConsumeTimeout is the client's ConsumeTimeout: 15 minutes. A
	// listener call running longer is sent back to the broker for redelivery.
	DefaultConsumeTimeout = 15 * time.Minute
	// DefaultMaxReconsumeTimes is the broker's default for the max reconsume
	// times (the client's -1): 16 redeliveries, 17 deliveries in all.
	DefaultMaxReconsumeTimes = 16
	// DefaultConsumeGoroutines is the client's number of listener goroutines
	// per topic: 20.
	DefaultConsumeGoroutines = 20
)

// Config configures a Listener and a PushConsumer. The zero value of every
// optional field means the default given in its comment.
type Config struct {
	// Consumer configures the idemq runtime: Store, Handler (or
	// LeaseHandler with Lease) and BusinessKey are used as documented there
	// (Store and one handler are required); Scope defaults to Group. A lease
	// TTL must be shorter than ConsumeTimeout. ShutdownGrace (default 10s) bounds how long
	// PushConsumer.Shutdown waits for in-flight handlers; Metrics and Logger
	// are used as given. RocketMQ retries through its %RETRY% topic, except
	// for the broker's last copy (ReconsumeTimes >= MaxReconsumeTimes), which
	// is retried in place with RetryInitial/RetryMax backoff so it never
	// reaches %DLQ% before its outcome is durable. The other pull-mode fields
	// (CommitEvery, CommitInterval, LaneBuffer, BatchWait) are ignored and
	// BatchSize must stay 1 (use BatchMaxSize). CrashLoop bounds a message
	// that kills the process (a lane is a queue, its offsets the queue
	// offsets); CrashLoop.InFlight defaults to ConsumeGoroutines ×
	// BatchMaxSize.
	Consumer consumer.Config

	// NameServers are the NameServer addresses ("127.0.0.1:9876"), resolved
	// with a passthrough resolver. Required by NewPushConsumer.
	NameServers []string
	// Group is the consumer group (clustering mode). Required by
	// NewPushConsumer; letters, digits, '_', '-', '%' and '|', at most 255
	// bytes.
	Group string
	// Topic is the subscribed topic; it must exist before Start (see
	// EnsureTopic). Required by NewPushConsumer.
	Topic string
	// Selector filters the topic's messages. Default: every tag
	// (TAG expression "*").
	Selector rmqconsumer.MessageSelector
	// InstanceName is the client's instance name, which must differ between
	// clients of one process. Default: InstanceName("idemq-" + Group).
	InstanceName string
	// MessageIDProperty names the user property holding the message ID.
	// Default wire.MessageIDHeader (message-id), the property idemq's
	// outbox relay writes.
	MessageIDProperty string

	// ConsumeTimeout is the client's ConsumeTimeout: a listener call running
	// longer is sent back for redelivery. Default 15m; at least 1s.
	ConsumeTimeout time.Duration
	// MaxHandlerDuration bounds one handler execution: the handler's context
	// gets this deadline, and a handler that fails after it passed is a
	// failed attempt of class "timeout". Default 0: no bound. When set,
	// MaxHandlerDuration × BatchMaxSize must be below ConsumeTimeout.
	MaxHandlerDuration time.Duration
	// BatchMaxSize is the client's ConsumeMessageBatchMaxSize: how many
	// messages one listener call receives. Default 1; 1 to 1024. See the
	// package documentation on batches.
	BatchMaxSize int
	// MaxReconsumeTimes is how often the broker redelivers a message sent
	// back before moving it to %DLQ%<group>. Default 16 (0 or -1 mean 16); it
	// must be at least dedup Config.MaxAttempts - 1, so that the attempts
	// counted in Postgres, not the broker, decide when a message is final.
	MaxReconsumeTimes int32
	// ConsumeGoroutines is the client's ConsumeGoroutineNums: listener calls
	// running at once per topic. Default 20; 1 to 100000.
	ConsumeGoroutines int
	// DelayLevels are the broker's messageDelayLevel durations, used to
	// compute the redelivery horizon that dedup's SucceededRetention must
	// exceed. Default DefaultDelayLevels (the broker's default
	// "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"); see
	// ParseDelayLevels.
	DelayLevels []time.Duration

	// ClientOptions are extra rocketmq-client-go consumer options (e.g.
	// WithConsumeFromWhere, WithCredentials, WithInterceptor). They are
	// applied before the adapter's own options, which set the group, the
	// passthrough resolver, the instance name, clustering mode,
	// ConsumeTimeout, batch size, MaxReconsumeTimes and goroutines from this
	// Config and therefore win.
	ClientOptions []rmqconsumer.Option

	// Observe, when set, is called after each message's Handle with its
	// delivery, result and error (err non-nil: nothing was recorded). It
	// runs on the listener goroutine and must be fast and safe for
	// concurrent use. For logs, tests and demos.
	Observe func(d consumer.Delivery, res dedup.Result, err error)
}

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/rocketmqadapter: invalid config")

func (c Config) withDefaults() Config {
	if c.Consumer.Scope == "" {
		c.Consumer.Scope = c.Group
	}
	if c.Selector.Type == "" && c.Selector.Expression == "" {
		c.Selector = rmqconsumer.MessageSelector{Type: rmqconsumer.TAG, Expression: "*"}
	}
	if c.InstanceName == "" && c.Group != "" {
		c.InstanceName = InstanceName("idemq-" + c.Group)
	}
	if c.MessageIDProperty == "" {
		c.MessageIDProperty = wire.MessageIDHeader
	}
	if c.ConsumeTimeout == 0 {
		c.ConsumeTimeout = DefaultConsumeTimeout
	}
	if c.BatchMaxSize == 0 {
		c.BatchMaxSize = 1
	}
	if c.MaxReconsumeTimes == 0 || c.MaxReconsumeTimes == -1 {
		c.MaxReconsumeTimes = DefaultMaxReconsumeTimes
	}
	if c.ConsumeGoroutines == 0 {
		c.ConsumeGoroutines = DefaultConsumeGoroutines
	}
	if c.DelayLevels == nil {
		c.DelayLevels = DefaultDelayLevels()
	}
	return c
}

// validate checks the listener fields (not NameServers, Group, Topic).
func (c Config) validate(maxAttempts int) error {
	switch {
	case c.ConsumeTimeout < time.Second:
		return fmt.Errorf("%w: ConsumeTimeout %s must be at least 1s", ErrInvalidConfig, c.ConsumeTimeout)
	case c.BatchMaxSize < 1 || c.BatchMaxSize > 1024:
		return fmt.Errorf("%w: BatchMaxSize %d must be 1 to 1024", ErrInvalidConfig, c.BatchMaxSize)
	case c.MaxHandlerDuration < 0:
		return fmt.Errorf("%w: MaxHandlerDuration %s must not be negative", ErrInvalidConfig, c.MaxHandlerDuration)
	case c.MaxHandlerDuration > 0 && c.MaxHandlerDuration*time.Duration(c.BatchMaxSize) >= c.ConsumeTimeout:
		return fmt.Errorf("%w: MaxHandlerDuration %s × BatchMaxSize %d = %s must be below ConsumeTimeout %s, or the client sends messages back while their handler still runs",
			ErrInvalidConfig, c.MaxHandlerDuration, c.BatchMaxSize, c.MaxHandlerDuration*time.Duration(c.BatchMaxSize), c.ConsumeTimeout)
	case c.MaxReconsumeTimes < 0 || c.MaxReconsumeTimes > 10000:
		return fmt.Errorf("%w: MaxReconsumeTimes %d must be 1 to 10000 (0 or -1 for 16)", ErrInvalidConfig, c.MaxReconsumeTimes)
	case int(c.MaxReconsumeTimes)+1 < maxAttempts:
		return fmt.Errorf("%w: MaxReconsumeTimes %d allows %d deliveries, fewer than dedup MaxAttempts %d: the broker would move the message to %%DLQ%% before idemq records it FAILED_FINAL",
			ErrInvalidConfig, c.MaxReconsumeTimes, c.MaxReconsumeTimes+1, maxAttempts)
	case c.ConsumeGoroutines < 1 || c.ConsumeGoroutines > 100000:
		return fmt.Errorf("%w: ConsumeGoroutines %d must be 1 to 100000", ErrInvalidConfig, c.ConsumeGoroutines)
	case strings.TrimSpace(c.MessageIDProperty) != c.MessageIDProperty:
		return fmt.Errorf("%w: MessageIDProperty %q has surrounding spaces", ErrInvalidConfig, c.MessageIDProperty)
	}
	for i, d := range c.DelayLevels {
		if d < 0 {
			return fmt.Errorf("%w: DelayLevels[%d] %s is negative", ErrInvalidConfig, i, d)
		}
	}
	return nil
}

// Horizon is how long after its first delivery the broker may still deliver a
// copy of a message under c: RedeliveryHorizon(DelayLevels,
// MaxReconsumeTimes) plus one ConsumeTimeout per delivery (a copy may wait
// that long in a listener before it is sent back). Defaults apply.
func (c Config) Horizon() time.Duration {
	d := c.withDefaults()
	return RedeliveryHorizon(d.DelayLevels, d.MaxReconsumeTimes) + time.Duration(d.MaxReconsumeTimes+1)*d.ConsumeTimeout
}

// Listener is the RocketMQ listener that runs idemq for each message; its
// Consume method is the function given to PushConsumer.Subscribe. Build it
// with NewListener (or let NewPushConsumer build it). It is safe for
// concurrent use.
type Listener struct {
	c       *consumer.Consumer
	cfg     Config
	log     *slog.Logger
	locks   keyLocks
	base    context.Context
	abort   context.CancelFunc
	aborted chan struct{}

	mu       sync.Mutex
	stopping bool
	inflight int
	idle     chan struct{} // closed when stopping and inflight == 0
}

// NewListener validates cfg (NameServers, Group and Topic are not needed)
// and builds the idemq consumer it runs. It returns an error wrapping
// ErrInvalidConfig (or consumer.ErrInvalidConfig) when a field is out of
// range, when MaxHandlerDuration × BatchMaxSize or the lease TTL of a
// consumer.Config.LeaseHandler does not fit under ConsumeTimeout, or when
// MaxReconsumeTimes allows fewer deliveries than dedup MaxAttempts; and an
// error wrapping dedup.ErrRetentionTooShort when the store's
// SucceededRetention does not exceed cfg.Horizon(). Each error names the
// numbers compared.
func NewListener(cfg Config) (*Listener, error) {
	cfg = cfg.withDefaults()
	if cfg.Consumer.Store == nil {
		return nil, fmt.Errorf("%w: Consumer.Store is required", ErrInvalidConfig)
	}
	if err := cfg.validate(cfg.Consumer.Store.MaxAttempts()); err != nil {
		return nil, err
	}
	if err := cfg.Consumer.Store.ValidateRetention(cfg.Horizon()); err != nil {
		return nil, fmt.Errorf("idemq/rocketmqadapter: %w (MaxReconsumeTimes %d, ConsumeTimeout %s)", err, cfg.MaxReconsumeTimes, cfg.ConsumeTimeout)
	}
	cc := cfg.Consumer
	if cc.CrashLoop.InFlight == 0 {
		// At most this many listener calls' messages run at once, so at most
		// this many of a queue can have been running when a process died.
		cc.CrashLoop.InFlight = cfg.ConsumeGoroutines * cfg.BatchMaxSize
	}
	if cc.BatchSize > 1 {
		return nil, fmt.Errorf("%w: Consumer.BatchSize %d is for pull consumers (Kafka); RocketMQ batches come from BatchMaxSize", ErrInvalidConfig, cc.BatchSize)
	}
	if cc.LeaseHandler != nil {
		if err := cc.Lease.ValidateUnder(cfg.ConsumeTimeout); err != nil {
			return nil, fmt.Errorf("%w: Consumer.Lease: %v (RocketMQ ConsumeTimeout)", ErrInvalidConfig, err)
		}
	}
	if cfg.MaxHandlerDuration > 0 {
		if cc.Handler != nil {
			cc.Handler = boundHandler(cc.Handler, cfg.MaxHandlerDuration)
		}
		if cc.LeaseHandler != nil {
			lh := cc.LeaseHandler
			h := boundHandler(func(ctx context.Context, _ pgx.Tx, msg *dedup.Message) error { return lh(ctx, msg) }, cfg.MaxHandlerDuration)
			cc.LeaseHandler = func(ctx context.Context, msg *dedup.Message) error { return h(ctx, nil, msg) }
		}
	}
	c, err := consumer.New(cc)
	if err != nil {
		return nil, err
	}
	base, abort := context.WithCancel(context.Background())
	l := &Listener{c: c, cfg: cfg, log: c.Config().Logger.With("scope", cc.Scope, "adapter", "rocketmq"),
		locks: keyLocks{m: map[string]*keyLock{}}, base: base, abort: abort, aborted: make(chan struct{}), idle: make(chan struct{})}
	return l, nil
}

// Consumer returns the idemq consumer the listener runs.
func (l *Listener) Consumer() *consumer.Consumer { return l.c }

// Config returns the listener's configuration with defaults applied.
func (l *Listener) Config() Config { return l.cfg }

// Consume is the listener: it has the signature PushConsumer.Subscribe
// wants. It handles every message of msgs in order through
// consumer.Consumer.Handle and returns ConsumeSuccess only when all of them
// have a durable, acknowledgeable outcome, else ConsumeRetryLater (see the
// package documentation). The error is always nil: the client would treat
// it like the result alone, so failures are logged instead. The queue of a
// message is taken from msg.Queue, else from the client's consume context
// (primitive.GetConcurrentlyCtx).
func (l *Listener) Consume(ctx context.Context, msgs ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
	if !l.enter() {
		// Stopping: hold the message until the client is down (its result is
		// then ignored and the offset not committed), so that it is neither
		// acknowledged nor sent back to %RETRY% needlessly.
		<-l.aborted
		return rmqconsumer.ConsumeRetryLater, nil
	}
	defer l.exit()
	var mq *primitive.MessageQueue
	if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok && cc != nil && cc.MQ.Topic != "" {
		q := cc.MQ
		mq = &q
	}
	result := rmqconsumer.ConsumeSuccess
	for _, m := range msgs {
		if m == nil {
			continue
		}
		d := toDelivery(m, mq, l.cfg.MessageIDProperty)
		// The broker's last copy: answering ConsumeRetryLater would move it
		// to %DLQ%, out of Postgres' view, while its attempts may not even
		// be recorded (database down, lease held). Retry it in place
		// instead, until its outcome is durable (at worst FAILED_FINAL with
		// a dead letter after MaxAttempts) or the listener is aborted.
		last := m.ReconsumeTimes >= l.cfg.MaxReconsumeTimes
		res, err := l.handle(d, last)
		if l.cfg.Observe != nil {
			l.cfg.Observe(d, res, err)
		}
		if err != nil || !res.Outcome.Acked() {
			if result == rmqconsumer.ConsumeSuccess && len(msgs) > 1 {
				l.log.Info("idemq: batch will be redelivered: a message needs a retry", "batch", len(msgs), "message_id", d.MessageID, "source", d.Position)
			}
			result = rmqconsumer.ConsumeRetryLater
		}
	}
	return result, nil
}

// handle runs one delivery, one copy per message ID at a time in this
// process; inPlace retries it with backoff until it may be acked.
func (l *Listener) handle(d consumer.Delivery, inPlace bool) (dedup.Result, error) {
	key := d.MessageID
	if key == "" {
		key = d.Position
	}
	unlock, err := l.locks.lock(l.base, key)
	if err != nil {
		return dedup.Result{}, fmt.Errorf("idemq/rocketmqadapter: waiting for another copy of %s: %w", key, err)
	}
	defer unlock()
	if inPlace {
		return l.c.HandleInPlace(l.base, d)
	}
	return l.c.Handle(l.base, d)
}

func (l *Listener) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopping {
		return false
	}
	l.inflight++
	return true
}

func (l *Listener) exit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	if l.stopping && l.inflight == 0 {
		close(l.idle)
	}
}

// Stop makes the listener take no new message (calls that arrive later wait
// until Abort, then answer ConsumeRetryLater) and waits until the calls in
// flight have returned or ctx ends; it returns ctx's error in that case.
// Call Stop, then shut the client down, then Abort. Safe to call more than
// once.
func (l *Listener) Stop(ctx context.Context) error {
	l.mu.Lock()
	if !l.stopping {
		l.stopping = true
		if l.inflight == 0 {
			close(l.idle)
		}
	}
	l.mu.Unlock()
	select {
	case <-l.idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Abort cancels the context of the handlers still running (their
// transactions roll back, nothing is recorded, their calls answer
// ConsumeRetryLater) and releases the calls held by Stop. Safe to call more
// than once.
func (l *Listener) Abort() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.aborted:
	default:
		l.abort()
		close(l.aborted)
	}
}

// boundHandler gives each execution of h a deadline of limit; a handler error
// after the deadline passed is reported as a timeout (errors.Is
// context.DeadlineExceeded, class "timeout").
func boundHandler(h pgstore.Handler, limit time.Duration) pgstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
		hctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		err := h(hctx, tx, msg)
		if err != nil && ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("handler exceeded MaxHandlerDuration %s: %w (%w)", limit, context.DeadlineExceeded, err)
		}
		return err
	}
}

// keyLocks is a set of per-key mutexes that can be waited for with a
// context.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sem  chan struct{}
	refs int
}

func (k *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	kl := k.m[key]
	if kl == nil {
		kl = &keyLock{sem: make(chan struct{}, 1)}
		k.m[key] = kl
	}
	kl.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		kl.refs--
		if kl.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case kl.sem <- struct{}{}:
		return func() { <-kl.sem; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
