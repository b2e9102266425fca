// Package leasectx carries the running lease-mode execution's lease in a
// context.Context. dedup.LeaseFromContext reads it; the lease engine
// (internal/lease) sets it. It is a package of its own so that both can
// import it without importing each other.
package leasectx

import "context"

type key struct{}

// With returns ctx carrying v (a dedup.Lease).
func With(ctx context.Context, v any) context.Context { return context.WithValue(ctx, key{}, v) }

// From returns the value With stored in ctx, or nil.
func From(ctx context.Context) any { return ctx.Value(key{}) }
