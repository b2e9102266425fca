package main

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/httpidem"
	"github.com/spf13/cobra"
)

// The --http-* flags compose the scope with httpidem.Scope, and every
// ambiguous or incomplete combination is refused with a usage error.
func TestScopeFlagsResolve(t *testing.T) {
	for _, c := range []struct {
		name     string
		args     []string
		optional bool
		want     string // the scope, or the error's text
		wantErr  bool
	}{
		{name: "scope", args: []string{"--scope", "billing"}, want: "billing"},
		{name: "http", args: []string{"--http-tenant", "acme", "--http-principal", "a|b", "--http-method", "POST", "--http-route", "POST /payments"},
			want: httpidem.Scope("acme", "a|b", "POST", "POST /payments")},
		{name: "http without tenant", args: []string{"--http-principal", "bob", "--http-method", "PATCH", "--http-route", "/x"},
			want: httpidem.Scope("", "bob", "PATCH", "/x")},
		{name: "anonymous", args: []string{"--http-anonymous", "sess|1", "--http-method", "POST", "--http-route", "POST /gifts"},
			want: httpidem.AnonymousScope("", "sess|1", "POST", "POST /gifts")},
		{name: "anonymous and principal", args: []string{"--http-anonymous", "s1", "--http-principal", "s1", "--http-method", "POST", "--http-route", "/x"},
			want: "not both", wantErr: true},
		{name: "blank anonymous", args: []string{"--http-anonymous", " ", "--http-method", "POST", "--http-route", "/x"}, want: "--http-anonymous is blank", wantErr: true},
		{name: "none", want: "--scope is required", wantErr: true},
		{name: "none, optional", optional: true, want: ""},
		{name: "both", args: []string{"--scope", "s", "--http-method", "POST", "--http-route", "/x"}, want: "not both", wantErr: true},
		{name: "no route", args: []string{"--http-tenant", "acme", "--http-method", "POST"}, want: "--http-method and --http-route are required", wantErr: true},
		{name: "empty flag given", args: []string{"--http-tenant", ""}, want: "--http-method and --http-route are required", wantErr: true},
		{name: "redis", args: []string{"--http-method", "POST", "--http-route", "/x", "--redis", "redis://127.0.0.1:6379/0"}, want: "not for a Redis-only store", wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := &cobra.Command{Use: "inspect"}
			var f storeFlags
			f.register(cmd, true)
			var sf scopeFlags
			sf.register(cmd)
			if err := cmd.ParseFlags(c.args); err != nil {
				t.Fatal(err)
			}
			got, err := sf.resolve(cmd, &f, c.optional)
			switch {
			case c.wantErr && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "inspect: ") || !isUsage(err)):
				t.Fatalf("err %v, want a usage error with %q", err, c.want)
			case !c.wantErr && (err != nil || got != c.want):
				t.Fatalf("scope %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
