package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDrawChart(t *testing.T) {
	r := testReport()
	for _, name := range []string{"chart.svg", "chart.png"} {
		path := filepath.Join(t.TempDir(), name)
		if err := drawChart(r, path); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) < 1000 {
			t.Errorf("%s: %d bytes", name, len(data))
		}
		if strings.HasSuffix(name, ".svg") && (strings.Contains(string(data), "NaN") || strings.Contains(string(data), "Inf")) {
			t.Errorf("%s holds NaN or Inf coordinates", name)
		}
	}
}
