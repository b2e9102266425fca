package consumer_test

import (
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
)

// The capabilities New detects, checked at compile time here, so that the
// consumer package itself never imports a store.
var (
	_ consumer.TxStore         = (*pgstore.Store)(nil)
	_ consumer.StartMarker     = (*pgstore.Store)(nil)
	_ consumer.FastPathStatser = (*pgstore.Store)(nil)
	_ consumer.Store           = (*redisstore.Store)(nil)
)
