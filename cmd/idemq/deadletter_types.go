package main

import (
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
)

// The dead-letter verbs' types, short names for the library's.
type (
	// DeadLetterFilter selects dead letters (list, export, redrive).
	DeadLetterFilter = dedup.DeadLetterFilter
	// RedriveOptions tunes a bulk re-drive.
	RedriveOptions = dedup.RedriveOptions
	// RedriveSummary is what a bulk re-drive did.
	RedriveSummary = dedup.RedriveSummary
	// RepublishOptions tunes a republish through the outbox (Postgres).
	RepublishOptions = pgstore.RepublishOptions
	// RepublishResult is what a republish did.
	RepublishResult = pgstore.RepublishResult
)

// Both stores have what the verbs call.
var (
	_ deadLetterStore       = (*pgstore.Store)(nil)
	_ deadLetterStore       = (*redisstore.Store)(nil)
	_ deadLetterRepublisher = (*pgstore.Store)(nil)
	_ redisDeadLetterPurger = (*redisstore.Store)(nil)
)
