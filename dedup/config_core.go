package dedup

import "errors"

// ErrInvalidConfig is wrapped by every configuration error of this package.
var ErrInvalidConfig = errors.New("idemq: invalid config")

// ErrRetentionTooShort is returned by ValidateRetention.
var ErrRetentionTooShort = errors.New("idemq: retention shorter than the broker's redelivery horizon")
