package rocketmqadapter

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultDelayLevels returns the broker's default messageDelayLevel:
// 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h (levels 1 to 18).
func DefaultDelayLevels() []time.Duration {
	return []time.Duration{
		time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute,
		6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute,
		20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour,
	}
}

// ParseDelayLevels parses a broker messageDelayLevel value, durations
// separated by spaces, each a number followed by s, m, h or d (e.g.
// "1s 5s 10s 30s 1m 2h 1d"). It returns an error naming the bad field.
func ParseDelayLevels(s string) ([]time.Duration, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, fmt.Errorf("idemq/rocketmqadapter: delay levels %q: empty", s)
	}
	out := make([]time.Duration, 0, len(fields))
	for i, f := range fields {
		if len(f) < 2 {
			return nil, fmt.Errorf("idemq/rocketmqadapter: delay level %d %q: want a number and s, m, h or d", i+1, f)
		}
		var unit time.Duration
		switch f[len(f)-1] {
		case 's':
			unit = time.Second
		case 'm':
			unit = time.Minute
		case 'h':
			unit = time.Hour
		case 'd':
			unit = 24 * time.Hour
		default:
			return nil, fmt.Errorf("idemq/rocketmqadapter: delay level %d %q: unit must be s, m, h or d", i+1, f)
		}
		n, err := strconv.ParseInt(f[:len(f)-1], 10, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("idemq/rocketmqadapter: delay level %d %q: want a non-negative number", i+1, f)
		}
		out = append(out, time.Duration(n)*unit)
	}
	return out, nil
}

// RedeliveryHorizon is the sum of the delays a message waits between its
// deliveries when its listener answers ConsumeRetryLater every time: the
// broker schedules the copy after the n-th failure (ReconsumeTimes n-1) at
// delay level 3+(n-1), capped at the last level, for maxReconsumeTimes
// redeliveries (-1 or 0 mean 16), after which it goes to %DLQ%. levels are
// the broker's messageDelayLevel durations (DefaultDelayLevels). With the
// defaults it is 4h45m40s. Feed it, plus any consume time, to
// pgstore.Store.ValidateRetention (Config.Horizon does).
func RedeliveryHorizon(levels []time.Duration, maxReconsumeTimes int32) time.Duration {
	if maxReconsumeTimes <= 0 {
		maxReconsumeTimes = DefaultMaxReconsumeTimes
	}
	if len(levels) == 0 {
		return 0
	}
	var total time.Duration
	for i := int32(0); i < maxReconsumeTimes; i++ {
		lvl := 3 + int(i)
		if lvl > len(levels) {
			lvl = len(levels)
		}
		total += levels[lvl-1]
	}
	return total
}
