// Command rocketmq-drill is the RocketMQ SIGKILL backlog drill (`make
// drill-rocketmq`): it measures what redeliveries cost with the push listener
// (rocketmqadapter.NewPushConsumer) and with the pull-mode
// rocketmqadapter.Source under consumer.Run, on the real broker and Postgres.
//
// For each mode, "run" creates a fresh topic with 4 queues, a group and a
// Postgres schema, sends N messages (-messages, env DRILL_MESSAGES, default
// 3000) first, then starts two consumer processes (this program re-run as
// "consume"). Every -interval (default 3s) it SIGKILLs one of them, in turn,
// and restarts it, K times in all (-kills, env DRILL_KILLS, default 20).
// Once every message is applied and no delivery came for 3s, it stops both
// with SIGTERM and prints, for each mode side by side, numbers read from
// durable state only:
//
//   - effects applied: rows of the handler's effects table (unique key: the
//     message ID; a second commit would raise its applies column), which
//     must equal the messages sent;
//   - deliveries: rows the consumers wrote, one per delivery with an
//     acknowledgeable outcome, after the outcome was durable and before the
//     broker was answered, and deliveries per message. A SIGKILL between
//     the outcome's commit and its row loses the row, but then the broker
//     was not answered either: that message comes again and its next
//     delivery is counted (as a duplicate);
//   - duplicates absorbed (deliveries whose outcome was duplicate) and the
//     most deliveries of one message;
//   - dead letters (must be 0: MaxAttempts is raised to 16 so that a
//     message in flight at several kills is not taken for a crasher);
//   - the broker lag after the graceful stop: per queue, the end offset
//     written minus the group's committed offset, read from the broker.
//
// It exits 1 when exactly-once fails in a mode (effects or applies not equal
// to the messages, or a dead letter). Settings come from the environment:
// TEST_POSTGRES_DSN, TEST_ROCKETMQ_NAMESRV and TEST_ROCKETMQ_BROKER (as
// exported by scripts/services.sh env).
package main
