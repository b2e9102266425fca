package pgstore

import (
	"strings"
	"testing"
)

// TestStatementsBind fails when a statement the store runs is missing from
// sql/*.sql, when one of the files' statements or fragments is used by no
// code, or when a statement refers to a table name the store does not give
// (duplicated names fail earlier, at package initialization).
func TestStatementsBind(t *testing.T) {
	for _, cfg := range []Config{
		Config{}.withDefaults(),
		{Schema: "s_1", RecordsTable: "recs", DeadLettersTable: "dls", MaxErrorBytes: 64},
	} {
		q, err := newQueries(cfg)
		if err != nil {
			t.Fatal(err)
		}
		records := `"` + cfg.Schema + `"."` + cfg.RecordsTable + `"`
		for name, sql := range map[string]string{"claim_insert": q.claimInsertSQL, "lease_lock": q.leaseLockSQL, "purge": q.purgeSQL} {
			if !strings.Contains(sql, records) || strings.Contains(sql, "{{") {
				t.Errorf("%s for %+v:\n%s", name, cfg, sql)
			}
		}
		if want := `"` + cfg.Schema + `"."` + cfg.RecordsTable + `_lane_watermarks"`; q.lanes != want || !strings.Contains(q.laneWatermarkAdvanceSQL, want) {
			t.Errorf("lane watermarks table %s, want %s", q.lanes, want)
		}
		if !strings.Contains(q.deadLettersListSQL, `"`+cfg.Schema+`"."`+cfg.DeadLettersTable+`_redrives"`) {
			t.Errorf("dead_letters_list: %s", q.deadLettersListSQL)
		}
	}
	if n := len(statements.Names()); n < 30 {
		t.Errorf("only %d statements parsed", n)
	}
}
