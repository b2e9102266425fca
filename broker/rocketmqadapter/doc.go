// Package rocketmqadapter connects idemq to RocketMQ through
// github.com/apache/rocketmq-client-go/v2 (Remoting protocol, so point it at
// the NameServer of a 4.x or 5.x broker, not at the gRPC proxy), in one of
// two modes, both thin translators into idemq's runtime (the user builds a
// *consumer.Consumer — store, handler, business key, MaxHandlerDuration,
// middleware, metrics — with consumer.New; Config and SourceConfig hold broker
// settings only):
//
//   - Source (recommended): a consumer.Source over the client's pull
//     consumer, run by consumer.Run like the Kafka source. idemq owns the
//     committed offsets, so they survive rebalances (see "Progress across
//     rebalances" below); retries happen in place and dead letters go to
//     Postgres.
//
//   - Listener and PushConsumer: NewPushConsumer(c, cfg) makes c the
//     listener of a push consumer in clustering mode, for teams wrapping
//     existing listeners. NewListener binds c's push entry point
//     (consumer.Consumer.Push) to the broker's timers and limits; for each
//     message the listener translates the MessageExt to a consumer.Delivery
//     (ToDelivery), calls consumer.Pusher.Handle (which claims it in the
//     store, runs the handler, in the claim's transaction in atomic mode, and
//     records the outcome), and maps the Verdict to the client's
//     ConsumeResult; only then is the broker answered. The client owns the
//     offsets.
//
//     c, err := consumer.New(consumer.Config{Scope: "order-svc", Store: store, Handler: h})
//     pc, err := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{
//     NameServers: ns, Group: "order-svc", Topic: "orders"})
//
// The rest of this documentation describes the push listener unless it
// names the Source.
//
// The package is named rocketmqadapter so that it does not shadow the
// client's own consumer, producer and primitive packages.
//
// # Identity
//
// The message ID of a delivery is, in order:
//
//  1. the message-id user property (wire.MessageIDHeader,
//     Config.MessageIDProperty), stamped by
//     idemq's outbox relay or by any producer that re-sends a message under
//     the same ID;
//  2. otherwise MsgId, i.e. the UNIQ_KEY property the producer client stamps
//     once per send. It survives the client's internal send retries, the
//     broker's %RETRY% copies and consume-timeout resends;
//  3. otherwise the position "rocketmq:<topic>/<brokerName>/<queueId>/<queueOffset>"
//     of the stored copy (Position), where topic is the queue actually read
//     (%RETRY%<group> for a retry copy).
//
// A blank value ("", " ", "\t", any white space: wire.IsBlank) counts as
// absent at each step: a blank message-id property falls back to the
// UNIQ_KEY, never to a " " shared by every such message.
//
// OffsetMsgId is never used: it names one stored copy (broker address plus
// commit-log offset) and changes for every %RETRY% copy. When a message has
// no UNIQ_KEY the client sets MsgId to OffsetMsgId; the adapter detects that
// and uses the position instead, which is exactly as stable and says so.
//
// An application re-send (a second SendSync of the same intent) is a new
// message with a new UNIQ_KEY. Catch it either by re-using the message-id
// property, or with a business key: consumer.Config.BusinessKey, e.g.
// BusinessKeyFromKeys to use the message Keys. The adapter never uses the
// Keys as business key unless told to.
//
// # Acknowledgement
//
// The listener returns, for each call of the client:
//
//   - ConsumeSuccess only after every message of the call has a durable
//     outcome in the store (Pusher.Handle answered consumer.Ack: no error and
//     an acknowledgeable outcome: processed, duplicate, conflict, dead
//     letter);
//   - ConsumeRetryLater when any message got consumer.RetryLater:
//     dedup.OutcomeRetry (the handler failed and attempts remain) or an
//     error (the database is unreachable, or the consumer is shutting down). The client then
//     sends the message back to the broker, which redelivers a copy through
//     %RETRY%<group> after delay level 3+ReconsumeTimes.
//
// The listener never returns an error to the client (the client treats a
// result with an error exactly like the result alone); it logs instead.
//
// # Retries and attempts
//
// The number of handler executions is decided by the consumption record's
// attempts column in Postgres and pgstore.Config.MaxAttempts, not by the
// copy's ReconsumeTimes: copies may be lost, duplicated or reordered, and a
// copy delivered because the database was down did not run the handler. When
// the last attempt fails the store writes FAILED_FINAL and a dead-letter row
// in one transaction and Handle returns dedup.OutcomeDeadLetter: the
// listener answers ConsumeSuccess, so the message never reaches the broker's
// %DLQ% topic. Each copy's ReconsumeTimes is recorded on
// dedup.Message.ReconsumeTimes (column reconsume_times).
//
// The broker must allow at least MaxAttempts deliveries:
// Config.MaxReconsumeTimes must be at least the store's MaxAttempts-1
// (consumer.PushConfig.MaxRedeliveries, checked by NewListener). Leave
// headroom: a delivery that met a database outage also uses one reconsume.
// The broker's last copy (ReconsumeTimes >= MaxReconsumeTimes) is never sent
// back: answering ConsumeRetryLater would move it to %DLQ%<group> out of the
// store's view, so Pusher.Handle retries it in place (consumer.Config
// RetryInitial/RetryMax backoff) until its outcome is durable — at worst
// FAILED_FINAL with a dead letter after MaxAttempts.
//
// # Batches
//
// With Config.BatchMaxSize > 1 the client hands several messages to one
// listener call and applies the single result to all of them. The listener
// handles every message of the batch, each in its own transaction, and
// returns ConsumeRetryLater when any of them needs a retry. The messages that
// succeeded are then sent back too and come again as duplicates, which their
// SUCCEEDED records absorb without running the handler: per-message outcomes
// are kept in Postgres, only the acknowledgement is per batch.
//
// # Copies in flight and timeouts
//
// Two copies of one message (a %RETRY% copy, or a consume-timeout resend,
// arriving while the first still runs) serialize: in one process on an
// in-memory lock per message ID, across processes on the record's row lock.
// A copy is never acknowledged before the first copy's outcome is durable.
//
// The client sends a message back when its listener call runs longer than
// ConsumeTimeout (15 minutes by default). consumer.Config.MaxHandlerDuration,
// the one handler bound of every broker, bounds each handler execution (the
// handler's context gets that deadline and a timeout counts as a failed
// attempt); NewListener refuses a bound that does not fit BatchMaxSize times
// under ConsumeTimeout, and a lease TTL that does not fit under it.
//
// # Clients and topics
//
// Each PushConsumer gets its own instance name (InstanceName, unique per
// process and client): clients sharing an instance name share one internal
// client and break each other on Shutdown. Name servers are resolved with
// primitive.NewPassthroughResolver (the client's default resolver is HTTP).
// The topic must exist before Start (the client refuses to start without a
// route); EnsureTopic creates it through the admin API. A new group's retry
// topic %RETRY%<group> is created by the broker only at the group's first
// heartbeat, after the client has looked up its routes, so the first
// redeliveries would wait for the client's 30-second route refresh;
// EnsureRetryTopic creates it before Start.
//
// A topic's queues can be added while it is consumed (its read and write
// queue counts raised, an updateTopic admin request; EnsureTopic with more
// queues sends one): the client learns the new queues at its next route
// refresh (every 30s) and assigns them at its next rebalance (every 20s),
// so a Source and a PushConsumer consume them within AddedQueueBound
// (50s). A new queue starts at offset 0: the broker answers 0 for a queue
// the group has no offset for while its first message is still in memory,
// whatever the ConsumeFromWhere option says. The Source commits the new
// queues' offsets like the others.
//
// # Shutdown
//
// PushConsumer.Shutdown stops taking new messages, lets in-flight handlers
// finish for up to consumer.Config.ShutdownGrace, shuts the client down,
// then cancels the handlers still running: their transactions roll back and
// their messages are redelivered later. The client's Shutdown writes the
// offsets still in its offset table, which after a rebalance is not all of
// them (see "Progress across rebalances").
//
// The committed offset of a queue is the lowest message not yet answered;
// the client sends it with each pull request and every 5 s. A crash
// therefore redelivers every message that was not answered yet, including
// those whose transaction had committed (the window between commit and
// ack), plus whatever was answered since the offset was last sent; their
// records make them duplicates.
//
// # Progress across rebalances
//
// The pinned client (v2.1.3-0.20251226070945-2173d070fd1b) loses
// a push consumer's progress at every rebalance: when it gives a queue up it
// persists that queue's offset with a call that also deletes every other
// queue from its in-memory offset table (consumer/offset_store.go, persist;
// apache/rocketmq-client-go#927, #832). The offsets of the queues it keeps
// are then not written again until that queue's next acknowledgement or idle
// long poll, and of two queues given up in one rebalance only the first is
// written. A graceful stop soon after a rebalance therefore leaves lag behind,
// and the new owners read behind.
//
// The push consumer's offset table is private, and its public API
// (PersistConsumerOffset, GetOffsetDiffMap, Suspend/Resume, ResetOffset,
// which drops every process queue and sleeps 10 s) offers no way to record
// an offset again, so the loss stays on the push path: a documented
// limitation, counted by QueueMetrics, which idemq's dedup absorbs (effects
// stay exactly-once; every redelivery costs a claim round trip, and
// SucceededRetention must cover it).
//
// The Source does not depend on the client's table: at every Commit (every
// consumer.Config CommitEvery deliveries or CommitInterval) it records the
// offset of every queue it still owns again (PullConsumer.UpdateOffset) and
// writes them at once (PersistOffset), and again on Close; before a
// rebalance takes queues away (its allocation strategy wraps
// SourceConfig.Strategy) it revokes their lanes, dropping the deliveries not
// started, and commits the completed ones (consumer.Revocable). Measured on
// RocketMQ 5.3.3 (integration tests TestRocketMQRebalanceKeepsProgress and
// TestRocketMQBacklogRebalanceDeliveries, one host):
//
//	                                     push listener         Source
//	A acks 8 (2 per queue), B joins,     9–12 deliveries,      8 deliveries,
//	  both stop gracefully               lag 2–4               lag 0
//	3,000 written first; A, B; C joins,  3,030–3,693           3,004–3,071
//	  A leaves; B, C stop gracefully     (1.01–1.23 / msg),    (1.00–1.02 / msg),
//	                                     lag 0; 6.5–14 s       lag 0; 15–25 s
//
// The Source handles each queue in order, one delivery at a time (a lane per
// queue, as a Kafka partition), where the push listener runs
// ConsumeGoroutines (20) at once: with a slow handler (10 ms in the backlog
// test, 4 queues; wall times above are from parallel runs on 2 shared
// cores) the push listener drained the backlog about twice as fast.
// The Source's parallelism is the number of queues: give the topic more
// queues (EnsureTopic) for slow handlers, or use BatchSize for short ones.
//
// The push consumer's backlog lag reaches 0 there only because its queues
// stay busy until the end, so every kept queue is acknowledged again after
// the last rebalance; with SIGKILLs mixed in (a field report: 46,260
// deliveries for 5,610 messages) it does not.
//
// The Source's pull consumer has no flow control of its own beyond its
// channels (32 pulled batches per queue, PullBatchSize messages each, 32 by
// default), and its Shutdown closes a channel its pull goroutines send on:
// Close therefore unsubscribes and drains the pulled requests (until none
// came for 300ms, at most 5s) before it shuts the client down. The Source
// never sends a message back, so nothing reaches %RETRY%<group> from it
// (copies left there by an earlier push consumer of the group are still read
// and handled). Its redelivery horizon (Source.RedeliveryHorizon, a
// consumer.HorizonReporter) is the brokers' store retention: as for Kafka,
// a record must outlive any re-read after an offset reset (see Retention).
//
// # Retention
//
// A record must outlive every copy the broker may still deliver.
// RedeliveryHorizon sums the delay levels a message passes through up to
// MaxReconsumeTimes; NewListener refuses a pgstore.Config.SucceededRetention
// that does not exceed it plus one ConsumeTimeout per delivery
// (Config.Horizon, passed as consumer.PushConfig.RedeliveryHorizon; see
// pgstore.Store.ValidateRetention).
//
// Offset resets and replays hand out whatever the store still holds: a
// commit-log file lives fileReservedTime hours after its last write (72 by
// default), then waits for a deleteWhen hour ("04": up to 24h more).
// PushConsumer.Start (Config.FullHorizon) and consumer.Run over a Source
// (Source.RedeliveryHorizon) read both from every master broker of the
// topic (GET_BROKER_CONFIG, ReadStoreRetention) and refuse a shorter
// SucceededRetention (dedup.ErrRetentionTooShort naming both numbers); the
// push horizon also covers Config.DLQReplayWindow after the retries.
// Config.FileReservedTime (and SourceConfig's) replaces the read (no admin
// permission needed; the gap is then DefaultCleanupGap, 24h), and
// AcceptOffsetResetReplays drops the store retention from the horizon,
// accepting that a replay older than SucceededRetention runs again. See
// docs/operations.md, "RocketMQ retention".
//
// # Credentials
//
// Config.Credentials, SourceConfig.Credentials (and rocketmqpub's) sign
// every request for an ACL-enabled broker (RocketMQ 5.x ACL 2.0 accepts
// the client's HMAC-SHA1 signature). The adapter signs its own admin
// requests too (EnsureTopicWithCredentials, ReadStoreRetention), and a
// consumer with credentials probes them at Start: a broker's NO_PERMISSION
// (code 16) is an error wrapping ErrAccessDenied, with the broker's reason.
// See docs/operations.md, "Secured RocketMQ".
package rocketmqadapter
