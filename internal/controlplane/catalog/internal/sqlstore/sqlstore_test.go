package sqlstore

import (
	"testing"
	"time"
)

// The stores' behaviour is tested through catalogtest, against both
// databases; these are the parts with cases a database would not show.

func TestBind(t *testing.T) {
	tests := []struct {
		placeholder func(int) string
		q, want     string
	}{
		{nil, `a = ? AND b IN (?, ?)`, `a = ? AND b IN (?, ?)`},
		{Numbered, `a = ? AND b IN (?, ?)`, `a = $1 AND b IN ($2, $3)`},
		{Numbered, `metadata @> ?::jsonb`, `metadata @> $1::jsonb`},
		{Numbered, `SELECT count(*) FROM keys`, `SELECT count(*) FROM keys`},
		{Numbered, `?`, `$1`},
	}
	for _, tc := range tests {
		if got := (Dialect{Placeholder: tc.placeholder}).bind(tc.q); got != tc.want {
			t.Errorf("bind(%q) = %q, want %q", tc.q, got, tc.want)
		}
	}
}

func TestTimes(t *testing.T) {
	in := time.Date(2025, 3, 4, 5, 6, 7, 891234567, time.FixedZone("UTC+1", 3600))
	want := time.Date(2025, 3, 4, 4, 6, 7, 891234000, time.UTC)
	for _, text := range []bool{true, false} {
		s := &Store{d: Dialect{TextTimes: text}}
		if got := s.timeArg(time.Time{}); got != nil {
			t.Errorf("TextTimes %v: timeArg(zero) = %v, want nil", text, got)
		}
		var got time.Time
		if err := (timeDest{&got}).Scan(s.timeArg(in)); err != nil {
			t.Fatalf("TextTimes %v: Scan: %v", text, err)
		}
		if !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("TextTimes %v: %v stored and read back = %v, want %v in UTC", text, in, got, want)
		}
		if err := (timeDest{&got}).Scan(nil); err != nil || !got.IsZero() {
			t.Errorf("TextTimes %v: Scan(nil) = %v, %v; want the zero time", text, got, err)
		}
	}
	if got := (&Store{d: Dialect{TextTimes: true}}).timeArg(in); got != "2025-03-04T04:06:07.891234Z" {
		t.Errorf("timeArg as text = %v, want 2025-03-04T04:06:07.891234Z", got)
	}
}

func TestMaps(t *testing.T) {
	for _, m := range []map[string]string{nil, {}, {"a": "1", "ü": "\"x\""}} {
		enc, err := encMap(m)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]string
		if err := (mapDest{&got}).Scan([]byte(enc)); err != nil {
			t.Fatalf("Scan(%s): %v", enc, err)
		}
		if got == nil || len(got) != len(m) || got["ü"] != m["ü"] {
			t.Errorf("%#v stored as %s and read back = %#v", m, enc, got)
		}
	}
}
