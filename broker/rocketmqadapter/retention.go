package rocketmqadapter

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// DefaultCleanupGap is the cleanup gap assumed when the store retention is
// configured (Config.FileReservedTime) rather than read from the brokers:
// 24h, the longest wait for a once-a-day deleteWhen hour (the broker's
// default deleteWhen is "04").
const DefaultCleanupGap = 24 * time.Hour

// crashReplayHorizon is what a Source reports under AcceptOffsetResetReplays:
// it never sends a message back, so the broker only replays deliveries done
// but not yet committed (within consumer.Config.CommitInterval) after a
// crash or a rebalance.
const crashReplayHorizon = time.Minute

// StoreRetention is one broker's message-store retention, as its config
// says (GET_BROKER_CONFIG): how long a consumer group whose offsets are
// reset (mqadmin resetOffsetByTime, a new group from the first offset, a
// replay of %DLQ%) can still be handed an old message.
type StoreRetention struct {
	// BrokerName and Addr name the master broker read.
	BrokerName, Addr string
	// FileReservedTime is the broker's fileReservedTime (configured in
	// hours; default 72h): a commit-log file is deleted once it has not been
	// written to for that long.
	FileReservedTime time.Duration
	// DeleteWhen is the broker's deleteWhen: the hours of the day
	// ("04", "04;16") in which expired files are deleted (default "04").
	DeleteWhen string
	// CleanupGap is the longest wait from a file's expiry to the next
	// deleteWhen hour (CleanupGap(DeleteWhen)): 24h for one hour a day.
	CleanupGap time.Duration
}

// Horizon is FileReservedTime plus CleanupGap: how long after it was
// written a message may still be read from this broker's store. A
// commit-log file expires from its last write, so on a broker that fills a
// file slowly its first messages live longer by the time the file took to
// fill (see docs/operations.md, "RocketMQ retention").
func (r StoreRetention) Horizon() time.Duration { return r.FileReservedTime + r.CleanupGap }

// CleanupGap parses a broker's deleteWhen value (hours of the day 0 to 23,
// separated by ';', e.g. "04" or "04;16") and returns the longest wait from
// any moment to the start of the next such hour, rounded up to whole hours:
// 24h for one hour a day, 12h for "04;16". An empty value is the broker's
// default "04". Errors name the bad hour.
func CleanupGap(deleteWhen string) (time.Duration, error) {
	if strings.TrimSpace(deleteWhen) == "" {
		deleteWhen = "04"
	}
	seen := map[int]bool{}
	var hours []int
	for _, f := range strings.Split(deleteWhen, ";") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		h, err := strconv.Atoi(f)
		if err != nil || h < 0 || h > 23 {
			return 0, fmt.Errorf("idemq/rocketmqadapter: deleteWhen %q: hour %q must be 0 to 23", deleteWhen, f)
		}
		if !seen[h] {
			seen[h] = true
			hours = append(hours, h)
		}
	}
	if len(hours) == 0 {
		return 0, fmt.Errorf("idemq/rocketmqadapter: deleteWhen %q: no hour", deleteWhen)
	}
	sort.Ints(hours)
	gap := 24 - hours[len(hours)-1] + hours[0] // from the last hour to the first of the next day
	for i := 1; i < len(hours); i++ {
		gap = max(gap, hours[i]-hours[i-1])
	}
	return time.Duration(gap) * time.Hour, nil
}

// ReadStoreRetention reads the store retention of every master broker of
// topic's route (from the first name server that answers) with
// GET_BROKER_CONFIG (request code 26), signed with cred when it has an
// access key. It needs the broker's admin permission under ACL; without
// it, configure Config.FileReservedTime (or SourceConfig.FileReservedTime)
// instead. A broker that refuses returns a *BrokerError (errors.Is
// ErrAccessDenied for NO_PERMISSION).
func ReadStoreRetention(ctx context.Context, nameServers []string, topic string, cred primitive.Credentials) ([]StoreRetention, error) {
	masters, err := masterBrokers(ctx, nameServers, topic, cred)
	if err != nil {
		return nil, fmt.Errorf("idemq/rocketmqadapter: route of topic %s: %w", topic, err)
	}
	out := make([]StoreRetention, 0, len(masters))
	for _, m := range masters {
		body, err := call(ctx, m[1], "GET_BROKER_CONFIG", reqGetBrokerConfig, nil, nil, cred)
		if err != nil {
			return nil, fmt.Errorf("idemq/rocketmqadapter: read the store retention of broker %s (set FileReservedTime to configure it instead): %w", m[0], err)
		}
		p := parseProperties(body)
		r := StoreRetention{BrokerName: m[0], Addr: m[1], DeleteWhen: p["deleteWhen"]}
		hours, err := strconv.Atoi(p["fileReservedTime"])
		if err != nil || hours <= 0 {
			return nil, fmt.Errorf("idemq/rocketmqadapter: broker %s at %s: fileReservedTime %q is not a positive number of hours", m[0], m[1], p["fileReservedTime"])
		}
		r.FileReservedTime = time.Duration(hours) * time.Hour
		if r.CleanupGap, err = CleanupGap(r.DeleteWhen); err != nil {
			return nil, fmt.Errorf("idemq/rocketmqadapter: broker %s at %s: %w", m[0], m[1], err)
		}
		out = append(out, r)
	}
	return out, nil
}

// validateCredentials checks that an access key and a secret key come
// together; errors name the field, never the secret.
func validateCredentials(c primitive.Credentials) error {
	switch {
	case c.AccessKey == "" && (c.SecretKey != "" || c.SecurityToken != ""):
		return fmt.Errorf("%w: Credentials.AccessKey is empty but a secret key or security token is set", ErrInvalidConfig)
	case c.AccessKey != "" && c.SecretKey == "":
		return fmt.Errorf("%w: Credentials.SecretKey is empty for access key %q", ErrInvalidConfig, c.AccessKey)
	case strings.TrimSpace(c.AccessKey) != c.AccessKey:
		return fmt.Errorf("%w: Credentials.AccessKey %q has surrounding spaces", ErrInvalidConfig, c.AccessKey)
	}
	return nil
}

// retention is the part of Config and SourceConfig that bounds offset
// resets and replays.
type retention struct {
	fileReservedTime time.Duration
	dlqReplayWindow  time.Duration
	acceptResets     bool
}

// validate checks the configured fields (names as in Config).
func (r retention) validate() error {
	switch {
	case r.fileReservedTime < 0:
		return fmt.Errorf("%w: FileReservedTime %s must not be negative (0: read it from the brokers)", ErrInvalidConfig, r.fileReservedTime)
	case r.fileReservedTime > 0 && r.fileReservedTime < time.Hour:
		return fmt.Errorf("%w: FileReservedTime %s must be at least 1h (the broker's fileReservedTime is in hours: 72 is 72*time.Hour)", ErrInvalidConfig, r.fileReservedTime)
	case r.dlqReplayWindow < 0:
		return fmt.Errorf("%w: DLQReplayWindow %s must not be negative", ErrInvalidConfig, r.dlqReplayWindow)
	case r.fileReservedTime > 0 && r.dlqReplayWindow > r.fileReservedTime:
		return fmt.Errorf("%w: DLQReplayWindow %s is longer than FileReservedTime %s: the brokers delete %%DLQ%% messages before the window ends", ErrInvalidConfig, r.dlqReplayWindow, r.fileReservedTime)
	}
	return nil
}

// storeHorizon returns the store retention the horizon must cover: 0 under
// acceptResets, else the configured fileReservedTime plus DefaultCleanupGap,
// else the largest Horizon of ReadStoreRetention. It also checks the
// DLQ replay window against the brokers' fileReservedTime (read when not
// configured and a window is set).
func (r retention) storeHorizon(ctx context.Context, nameServers []string, topic string, cred primitive.Credentials) (time.Duration, error) {
	if r.fileReservedTime > 0 {
		if r.acceptResets {
			return 0, nil
		}
		return r.fileReservedTime + DefaultCleanupGap, nil
	}
	if r.acceptResets && r.dlqReplayWindow == 0 {
		return 0, nil
	}
	rs, err := ReadStoreRetention(ctx, nameServers, topic, cred)
	if err != nil {
		return 0, err
	}
	var h time.Duration
	for _, s := range rs {
		if r.dlqReplayWindow > s.FileReservedTime {
			return 0, fmt.Errorf("%w: DLQReplayWindow %s is longer than broker %s's fileReservedTime %s: it deletes %%DLQ%% messages before the window ends",
				ErrInvalidConfig, r.dlqReplayWindow, s.BrokerName, s.FileReservedTime)
		}
		h = max(h, s.Horizon())
	}
	if r.acceptResets {
		return 0, nil
	}
	return h, nil
}

// probeAccess sends one request that needs the consumer's credentials
// (QUERY_CONSUMER_OFFSET of group on queue 0 of topic) to every master
// broker of topic, so that wrong credentials stop Start with an error
// wrapping ErrAccessDenied instead of a client that polls forever. Other
// failures (a broker down, no offset yet) are left to the client.
func probeAccess(ctx context.Context, nameServers []string, topic, group string, cred primitive.Credentials) error {
	masters, err := masterBrokers(ctx, nameServers, topic, cred)
	if err != nil {
		return nil // no route: the client's Start reports it
	}
	for _, m := range masters {
		_, err := call(ctx, m[1], "QUERY_CONSUMER_OFFSET", reqQueryConsumerOffset,
			map[string]string{"consumerGroup": group, "topic": topic, "queueId": "0"}, nil, cred)
		if errors.Is(err, ErrAccessDenied) {
			return fmt.Errorf("idemq/rocketmqadapter: consumer group %s on topic %s: broker %s refused access key %q: %w: %w",
				group, topic, m[0], cred.AccessKey, ErrAccessDenied, err)
		}
	}
	return nil
}
