package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/pflag"
)

// outputFormat is the value of -o/--output: table (default) or json.
type outputFormat string

func (o *outputFormat) String() string { return string(*o) }
func (o *outputFormat) Type() string   { return "table|json" }
func (o *outputFormat) Set(s string) error {
	switch s {
	case "table", "json":
		*o = outputFormat(s)
		return nil
	}
	return fmt.Errorf("want table or json, got %q", s)
}

// registerOutput adds -o/--output to fs.
func registerOutput(fs *pflag.FlagSet, o *outputFormat) {
	*o = "table"
	fs.VarP(o, "output", "o", "output format: table (for people) or json (one JSON value on stdout; progress and logs stay on stderr)")
}

// writeJSON writes v as one indented JSON value.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes tab-separated rows aligned in columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	_, _ = fmt.Fprintln(t.tw, header)
	return t
}

func (t *table) row(format string, args ...any) { _, _ = fmt.Fprintf(t.tw, format+"\n", args...) }

// flush reports a failed write to the output.
func (t *table) flush() error { return t.tw.Flush() }
