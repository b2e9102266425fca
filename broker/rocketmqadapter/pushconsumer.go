package rocketmqadapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
)

// abortWait bounds how long Shutdown waits for handlers after canceling
// them (their rollback and the Handle return).
const abortWait = 10 * time.Second

// PushConsumer is a rocketmq-client-go push consumer in clustering mode whose
// listener is a Listener. Build it with NewPushConsumer, then Start it once
// its topic exists, and Shutdown it at the end.
type PushConsumer struct {
	l   *Listener
	pc  rocketmq.PushConsumer
	cfg Config

	mu            sync.Mutex
	clientState        // under mu
	clientStarted bool // under mu: the client's Start ran (its Shutdown needs that)
}

// NewPushConsumer validates cfg (see NewListener; NameServers, Group and
// Topic are required here) and builds the client and its subscription, whose
// listener runs c. It does not connect: Start does. Errors are NewListener's,
// wrap ErrInvalidConfig naming the missing field, or come from the client.
// c's Scope is usually Group.
func NewPushConsumer(c *consumer.Consumer, cfg Config) (*PushConsumer, error) {
	switch {
	case len(cfg.NameServers) == 0:
		return nil, fmt.Errorf("%w: NameServers is required", ErrInvalidConfig)
	case cfg.Group == "":
		return nil, fmt.Errorf("%w: Group is required", ErrInvalidConfig)
	case cfg.Topic == "":
		return nil, fmt.Errorf("%w: Topic is required", ErrInvalidConfig)
	}
	l, err := NewListener(c, cfg)
	if err != nil {
		return nil, err
	}
	cfg = l.cfg
	opts := append([]rmqconsumer.Option(nil), cfg.ClientOptions...)
	opts = append(opts,
		rmqconsumer.WithGroupName(cfg.Group),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		rmqconsumer.WithInstance(cfg.InstanceName),
		rmqconsumer.WithConsumerModel(rmqconsumer.Clustering),
		rmqconsumer.WithConsumerOrder(false),
		rmqconsumer.WithConsumeTimeout(cfg.ConsumeTimeout),
		rmqconsumer.WithConsumeMessageBatchMaxSize(cfg.BatchMaxSize),
		rmqconsumer.WithMaxReconsumeTimes(cfg.MaxReconsumeTimes),
		rmqconsumer.WithConsumeGoroutineNums(cfg.ConsumeGoroutines),
	)
	if cfg.Credentials.AccessKey != "" {
		opts = append(opts, rmqconsumer.WithCredentials(cfg.Credentials))
	}
	pc, err := rmqconsumer.NewPushConsumer(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemq/rocketmqadapter: new push consumer: %w", err)
	}
	if err := pc.Subscribe(cfg.Topic, cfg.Selector, l.Consume); err != nil {
		_ = pc.Shutdown()
		return nil, fmt.Errorf("idemq/rocketmqadapter: subscribe %s: %w", cfg.Topic, err)
	}
	return &PushConsumer{l: l, pc: pc, cfg: cfg}, nil
}

// Listener returns the listener the consumer runs.
func (p *PushConsumer) Listener() *Listener { return p.l }

// InstanceName returns the client's instance name.
func (p *PushConsumer) InstanceName() string { return p.cfg.InstanceName }

// ErrShutdown is returned by Start after Shutdown.
var ErrShutdown = errors.New("idemq/rocketmqadapter: consumer shut down")

// startCheckTimeout bounds the checks Start runs before the client starts
// (the access probe and the store-retention read).
const startCheckTimeout = 30 * time.Second

// Start checks, then connects to the name servers, joins the group and
// starts consuming. The checks, at most 30s: first the store's read-only
// schema check (consumer.Consumer.CheckSchema, unless
// consumer.Config.SkipSchemaCheck: an error matching
// pgstore.ErrSchemaMissing / ErrSchemaOutdated, nothing consumed); with
// Credentials, one signed
// request to every master broker of Topic (an error wrapping
// ErrAccessDenied when a broker refuses the credentials, instead of a
// client that retries forever); then the redelivery horizon
// (Config.FullHorizon, which reads the brokers' fileReservedTime and
// deleteWhen unless configured) against the store's SucceededRetention (an
// error wrapping dedup.ErrRetentionTooShort naming both, or
// ErrInvalidConfig for a DLQReplayWindow longer than fileReservedTime).
// The topic must exist (see EnsureTopic): the client refuses to start when
// the name servers have no route for it. Starting twice is a no-op; a
// consumer whose Start failed cannot be started again (build a new one).
func (p *PushConsumer) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.err != nil || p.started {
		return p.start(ErrShutdown, p.pc.Start, "")
	}
	if err := p.check(); err != nil {
		p.err = err
		return err
	}
	return p.start(ErrShutdown, func() error { p.clientStarted = true; return p.pc.Start() }, "consumer group "+p.cfg.Group+" on topic "+p.cfg.Topic)
}

// check runs Start's checks before the client starts.
func (p *PushConsumer) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), startCheckTimeout)
	defer cancel()
	if err := p.l.c.CheckSchema(ctx); err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: consumer group %s: %w", p.cfg.Group, err)
	}
	if p.cfg.Credentials.AccessKey != "" {
		if err := probeAccess(ctx, p.cfg.NameServers, p.cfg.Topic, p.cfg.Group, p.cfg.Credentials); err != nil {
			return err
		}
	}
	h, err := p.cfg.FullHorizon(ctx)
	if err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: redelivery horizon of consumer group %s on topic %s: %w", p.cfg.Group, p.cfg.Topic, err)
	}
	if err := p.l.c.Config().Store.ValidateRetention(h); err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: consumer group %s on topic %s (retries %s, DLQReplayWindow %s, store retention; AcceptOffsetResetReplays %t): %w",
			p.cfg.Group, p.cfg.Topic, p.cfg.Horizon(), p.cfg.DLQReplayWindow, p.cfg.AcceptOffsetResetReplays, err)
	}
	return nil
}

// Shutdown stops consuming: the listener takes no new message, in-flight
// handlers get up to consumer.Config.ShutdownGrace to finish, the client shuts
// down (persisting consumed offsets to the broker), then handlers still
// running are canceled (rolled back, redelivered later) and awaited for up to
// 10s more. It returns the client's shutdown error. Safe to call more than
// once and before Start.
func (p *PushConsumer) Shutdown() error {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return nil
	}
	p.stopped = true
	clientStarted := p.clientStarted
	p.mu.Unlock()
	if !clientStarted {
		// Never started (or refused by Start's checks): the client's
		// Shutdown would dereference state only its Start creates.
		p.l.Abort()
		return nil
	}

	// Pause first: the client rebalances when the broker says the group
	// changed (a member leaving, often this one's peers stopping too), and
	// rocketmq-client-go's rebalance reads a flag its Shutdown writes
	// without a lock (a data race in the library). A paused consumer skips
	// new rebalances, and one already running has the drain below to end.
	p.pc.Suspend()
	grace, cancel := context.WithTimeout(context.Background(), p.l.c.Config().ShutdownGrace)
	drained := p.l.Stop(grace) == nil
	cancel()
	err := p.pc.Shutdown()
	p.l.Abort()
	if !drained {
		wait, cancel := context.WithTimeout(context.Background(), abortWait)
		if p.l.Stop(wait) != nil {
			p.l.log.Warn("idemq: handlers still running after shutdown; their messages will be redelivered")
		}
		cancel()
	}
	if err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: shutdown: %w", err)
	}
	return nil
}
