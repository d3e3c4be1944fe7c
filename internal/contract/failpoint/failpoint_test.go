package failpoint

import "testing"

func TestEnable(t *testing.T) {
	for _, bad := range []string{"x", "=crash", "x=explode"} {
		if err := Enable(bad); err == nil {
			t.Errorf("Enable(%q) = nil, want an error", bad)
		}
	}
	if err := Enable("a=crash, b=crash"); err != nil {
		t.Fatal(err)
	}
	if !enabled.Load() || actions["a"] != "crash" || actions["b"] != "crash" {
		t.Errorf("enabled %v, actions %v", enabled.Load(), actions)
	}
	Hit("c") // not enabled: returns
	if err := Enable(""); err != nil || enabled.Load() {
		t.Errorf("Enable(\"\") = %v, enabled %v", err, enabled.Load())
	}
}
