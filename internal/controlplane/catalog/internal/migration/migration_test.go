package migration

import (
	"slices"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	tests := []struct {
		name    string
		files   fstest.MapFS
		want    []string // names in order; nil = error
		wantSQL string   // SQL of the first migration
	}{
		{"ordered", fstest.MapFS{
			"m/0002_more.sql": file("B"), "m/0001_init.sql": file("A"), "m/README": file("x"),
		}, []string{"0001_init.sql", "0002_more.sql"}, "A"},
		{"gap", fstest.MapFS{"m/0001_a.sql": file("A"), "m/0003_c.sql": file("C")}, nil, ""},
		{"duplicate", fstest.MapFS{"m/0001_a.sql": file("A"), "m/0001_b.sql": file("B")}, nil, ""},
		{"not starting at 1", fstest.MapFS{"m/0002_a.sql": file("A")}, nil, ""},
		{"bad name", fstest.MapFS{"m/init.sql": file("A")}, nil, ""},
		{"none", fstest.MapFS{"m/README": file("x")}, nil, ""},
		{"no directory", fstest.MapFS{}, nil, ""},
	}
	for _, tc := range tests {
		ms, err := Load(tc.files, "m")
		if tc.want == nil {
			if err == nil {
				t.Errorf("%s: Load = %v, want an error", tc.name, ms)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: Load: %v", tc.name, err)
			continue
		}
		var got []string
		for i, m := range ms {
			got = append(got, m.Name)
			if m.Version != i+1 {
				t.Errorf("%s: %s has version %d, want %d", tc.name, m.Name, m.Version, i+1)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Load = %v, want %v", tc.name, got, tc.want)
		}
		if ms[0].SQL != tc.wantSQL {
			t.Errorf("%s: first SQL = %q, want %q", tc.name, ms[0].SQL, tc.wantSQL)
		}
	}
}

func TestPending(t *testing.T) {
	ms := []Migration{{Version: 1}, {Version: 2}, {Version: 3}}
	for _, tc := range []struct {
		applied, want int // want: how many are pending; -1 = error
	}{{0, 3}, {1, 2}, {3, 0}, {4, -1}} {
		got, err := Pending(ms, tc.applied)
		switch {
		case tc.want < 0 && err == nil:
			t.Errorf("Pending(applied %d) = %v, want an error", tc.applied, got)
		case tc.want >= 0 && (err != nil || len(got) != tc.want):
			t.Errorf("Pending(applied %d) = %d migrations, %v; want %d", tc.applied, len(got), err, tc.want)
		case tc.want > 0 && got[0].Version != tc.applied+1:
			t.Errorf("Pending(applied %d) starts at version %d, want %d", tc.applied, got[0].Version, tc.applied+1)
		}
	}
}
