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
	"github.com/idemq/idemq/wire"
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

// Config configures a Listener and a PushConsumer: broker settings only.
// The runtime (store, handler, business key, MaxHandlerDuration, middleware,
// metrics, logging, tracing, crash loops) is a *consumer.Consumer, given
// beside it. The zero value of every optional field means the default given
// in its comment.
type Config struct {
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
	// longer is sent back for redelivery. Default 15m; at least 1s. The
	// consumer's MaxHandlerDuration × BatchMaxSize and its lease TTL (lease
	// mode) must be below it (consumer.PushConfig.CallTimeout).
	ConsumeTimeout time.Duration
	// BatchMaxSize is the client's ConsumeMessageBatchMaxSize: how many
	// messages one listener call receives. Default 1; 1 to 1024. See the
	// package documentation on batches.
	BatchMaxSize int
	// MaxReconsumeTimes is how often the broker redelivers a message sent
	// back before moving it to %DLQ%<group>. Default 16 (when 0); 1 to
	// 10,000. The client's "-1 means 16" is refused: leave it 0. It
	// must be at least the store's MaxAttempts - 1, so that the attempts
	// counted in the store, not the broker, decide when a message is final.
	// The broker's last copy (ReconsumeTimes >= MaxReconsumeTimes) is
	// retried in place (consumer.Config.RetryInitial to RetryMax backoff)
	// so that it never reaches %DLQ% before its outcome is durable.
	MaxReconsumeTimes int32
	// ConsumeGoroutines is the client's ConsumeGoroutineNums: listener calls
	// running at once per topic. Default 20; 1 to 100000. With BatchMaxSize
	// it is the default of consumer.Config.CrashLoop.InFlight (ConsumeGoroutines
	// × BatchMaxSize; a lane is a queue, its offsets the queue offsets).
	ConsumeGoroutines int
	// DelayLevels are the broker's messageDelayLevel durations, used to
	// compute the redelivery horizon that dedup's SucceededRetention must
	// exceed. Default DefaultDelayLevels (the broker's default
	// "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"); see
	// ParseDelayLevels.
	DelayLevels []time.Duration

	// Credentials sign every request of the client and of the adapter's own
	// admin requests (the access probe and the store-retention read at
	// Start) for an ACL-enabled broker: access key, secret key and an
	// optional security token (rocketmq-client-go's primitive.Credentials;
	// RocketMQ 5.x ACL 2.0 users: access key = username, secret key =
	// password). Default none (unsigned). With an access key, Start first
	// sends one signed request to every master broker of Topic and fails
	// with an error wrapping ErrAccessDenied when a broker refuses them.
	Credentials primitive.Credentials

	// FileReservedTime is the brokers' fileReservedTime, how long they keep
	// a commit-log file after its last write. Default 0: Start reads it
	// (with deleteWhen) from every master broker of Topic
	// (ReadStoreRetention, which needs the admin permission under ACL).
	// When set (at least 1h; the broker counts whole hours), nothing is
	// read and the cleanup gap is taken as DefaultCleanupGap (24h). A
	// group's offsets reset to an earlier time (or a replay) can hand the
	// listener any message still stored, so the redelivery horizon Start
	// checks covers FileReservedTime plus the cleanup gap, unless
	// AcceptOffsetResetReplays.
	FileReservedTime time.Duration
	// DLQReplayWindow is how long after a message reached %DLQ%<group> an
	// operator may still replay it into the topic (or reset the group to
	// it). Start's redelivery horizon covers Horizon() + DLQReplayWindow.
	// Default 0: %DLQ% messages are not replayed. It must not exceed the
	// brokers' fileReservedTime (configured or read): they are gone by
	// then; Start and NewPushConsumer refuse a longer window
	// (ErrInvalidConfig).
	DLQReplayWindow time.Duration
	// AcceptOffsetResetReplays states that the operator accepts the risk of
	// offset resets and replays older than SucceededRetention: a message
	// handed out again after its record expired is processed again. The
	// redelivery horizon is then Horizon() (+ DLQReplayWindow) only, and the
	// brokers' config is not read (except to check a DLQReplayWindow when
	// FileReservedTime is 0). Default false: the horizon also covers the
	// store retention (FileReservedTime plus the cleanup gap; 96h with the
	// broker's defaults 72h and deleteWhen "04").
	AcceptOffsetResetReplays bool

	// ClientOptions are extra rocketmq-client-go consumer options (e.g.
	// WithConsumeFromWhere, WithInterceptor; credentials: the Credentials
	// field, which the adapter's own requests use too). They are
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
	if c.MaxReconsumeTimes == 0 {
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
func (c Config) validate() error {
	switch {
	case c.ConsumeTimeout < time.Second:
		return fmt.Errorf("%w: ConsumeTimeout %s must be at least 1s", ErrInvalidConfig, c.ConsumeTimeout)
	case c.BatchMaxSize < 1 || c.BatchMaxSize > 1024:
		return fmt.Errorf("%w: BatchMaxSize %d must be 1 to 1024", ErrInvalidConfig, c.BatchMaxSize)
	case c.MaxReconsumeTimes < 0 || c.MaxReconsumeTimes > 10000:
		return fmt.Errorf("%w: MaxReconsumeTimes %d must be 1 to 10000 (leave it 0 for the broker's default 16; -1 is not a default here)", ErrInvalidConfig, c.MaxReconsumeTimes)
	case c.ConsumeGoroutines < 1 || c.ConsumeGoroutines > 100000:
		return fmt.Errorf("%w: ConsumeGoroutines %d must be 1 to 100000", ErrInvalidConfig, c.ConsumeGoroutines)
	case strings.TrimSpace(c.MessageIDProperty) != c.MessageIDProperty:
		return fmt.Errorf("%w: MessageIDProperty %q has surrounding spaces", ErrInvalidConfig, c.MessageIDProperty)
	}
	if err := c.retention().validate(); err != nil {
		return err
	}
	if err := validateCredentials(c.Credentials); err != nil {
		return err
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

// retention returns c's store-retention settings.
func (c Config) retention() retention {
	return retention{fileReservedTime: c.FileReservedTime, dlqReplayWindow: c.DLQReplayWindow, acceptResets: c.AcceptOffsetResetReplays}
}

// FullHorizon is the redelivery horizon PushConsumer.Start checks the
// store's SucceededRetention against: the larger of Horizon() +
// DLQReplayWindow (retries through %RETRY%, then a replay from %DLQ%) and
// the store retention (FileReservedTime + DefaultCleanupGap when
// configured, else the largest StoreRetention.Horizon of the master
// brokers of Topic, read with Credentials; none under
// AcceptOffsetResetReplays). Errors are ReadStoreRetention's, or wrap
// ErrInvalidConfig for a DLQReplayWindow longer than a broker's
// fileReservedTime.
func (c Config) FullHorizon(ctx context.Context) (time.Duration, error) {
	d := c.withDefaults()
	store, err := d.retention().storeHorizon(ctx, d.NameServers, d.Topic, d.Credentials)
	if err != nil {
		return 0, err
	}
	return max(d.Horizon()+d.DLQReplayWindow, store), nil
}

// Listener is the RocketMQ listener that runs idemq for each message; its
// Consume method is the function given to PushConsumer.Subscribe. It is a
// thin translator: each MessageExt becomes a consumer.Delivery for the
// consumer's push entry point (consumer.Pusher), whose Verdict becomes the
// client's ConsumeResult. Build it with NewListener (or let NewPushConsumer
// build it). It is safe for concurrent use.
type Listener struct {
	c       *consumer.Consumer
	push    *consumer.Pusher
	cfg     Config
	log     *slog.Logger
	base    context.Context
	abort   context.CancelFunc
	aborted chan struct{}

	mu       sync.Mutex
	stopping bool
	inflight int
	idle     chan struct{} // closed when stopping and inflight == 0
}

// NewListener validates cfg (NameServers, Group and Topic are not needed)
// and binds c's push entry point (consumer.Consumer.Push) to the broker cfg
// describes: ConsumeTimeout, BatchMaxSize, ConsumeGoroutines,
// MaxReconsumeTimes and Horizon. It returns an error wrapping
// ErrInvalidConfig when a field of cfg is out of range or c is nil; an error
// wrapping consumer.ErrInvalidConfig when c's config does not fit the
// broker (MaxHandlerDuration × BatchMaxSize or the lease TTL not under
// ConsumeTimeout, MaxReconsumeTimes allowing fewer deliveries than the
// store's MaxAttempts, BatchSize > 1); and an error wrapping
// dedup.ErrRetentionTooShort when the store's SucceededRetention does not
// exceed cfg.Horizon(). Each error names the fields and numbers compared.
func NewListener(c *consumer.Consumer, cfg Config) (*Listener, error) {
	cfg = cfg.withDefaults()
	if c == nil {
		return nil, fmt.Errorf("%w: the consumer is nil (build it with consumer.New)", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	push, err := c.Push(consumer.PushConfig{
		CallTimeout:       cfg.ConsumeTimeout,
		DeliveriesPerCall: cfg.BatchMaxSize,
		ConcurrentCalls:   cfg.ConsumeGoroutines,
		MaxRedeliveries:   cfg.MaxReconsumeTimes,
		RedeliveryHorizon: cfg.Horizon(),
	})
	if err != nil {
		return nil, fmt.Errorf("idemq/rocketmqadapter: %w (ConsumeTimeout %s, BatchMaxSize %d, MaxReconsumeTimes %d)", err, cfg.ConsumeTimeout, cfg.BatchMaxSize, cfg.MaxReconsumeTimes)
	}
	base, abort := context.WithCancel(context.Background())
	l := &Listener{c: c, push: push, cfg: cfg, log: c.Config().Logger.With("scope", c.Config().Scope, "adapter", "rocketmq"),
		base: base, abort: abort, aborted: make(chan struct{}), idle: make(chan struct{})}
	return l, nil
}

// Consumer returns the idemq consumer the listener runs.
func (l *Listener) Consumer() *consumer.Consumer { return l.c }

// Config returns the listener's configuration with defaults applied.
func (l *Listener) Config() Config { return l.cfg }

// Consume is the listener: it has the signature PushConsumer.Subscribe
// wants. It hands every message of msgs in order to consumer.Pusher.Handle
// and returns ConsumeSuccess only when every Verdict is consumer.Ack, else
// ConsumeRetryLater (see the package documentation). The error is always nil: the client would treat
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
		// The broker's last copy (ReconsumeTimes >= MaxReconsumeTimes) is
		// retried in place by the Pusher until its outcome is durable or
		// the listener is aborted (l.base ends).
		v, res, err := l.push.Handle(l.base, d)
		if l.cfg.Observe != nil {
			l.cfg.Observe(d, res, err)
		}
		if v != consumer.Ack {
			if result == rmqconsumer.ConsumeSuccess && len(msgs) > 1 {
				l.log.Info("idemq: batch will be redelivered: a message needs a retry", "batch", len(msgs), "message_id", d.MessageID, "source", d.Position)
			}
			result = rmqconsumer.ConsumeRetryLater
		}
	}
	return result, nil
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
