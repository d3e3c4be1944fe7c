package rest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

func TestLimiter(t *testing.T) {
	l := newLimiter(2, 3, "exec, streams, file operations")
	var rel []func()
	take := func(sb, key string) error {
		r, err := l.acquire(sb, key)
		if err == nil {
			rel = append(rel, r)
		}
		return err
	}
	for i, tc := range []struct {
		sb, key string
		ok      bool
	}{
		{"a", "k", true}, {"a", "k", true}, {"a", "k", false}, // per sandbox
		{"b", "k", true}, {"b", "k", false}, // per key: 3
		{"c", "other", true}, // another key is not affected
	} {
		err := take(tc.sb, tc.key)
		if (err == nil) != tc.ok {
			t.Fatalf("step %d: acquire(%s, %s) = %v, want ok %v", i, tc.sb, tc.key, err, tc.ok)
		}
		if err != nil {
			if ae := classify(err); ae.Status != http.StatusTooManyRequests || ae.Code != "too_many_requests" {
				t.Errorf("step %d: %d %s, want 429 too_many_requests", i, ae.Status, ae.Code)
			}
		}
	}
	rel[0]()
	rel[0]() // a second release is a no-op
	if err := take("b", "k"); err != nil {
		t.Errorf("after one release: %v", err)
	}
	if err := take("a", "k"); err == nil {
		t.Error("a second release freed a second slot")
	}
}

func TestOutputBudget(t *testing.T) {
	b := &outputBudget{max: 3 * outputChunk}
	c := &capped{max: 10 * outputChunk, budget: b}
	c.Write(bytes.Repeat([]byte("x"), 5*outputChunk))
	if !c.truncated || c.n != 3*outputChunk {
		t.Errorf("kept %d bytes (truncated %v), want %d and truncated: the budget holds 3 chunks", c.n, c.truncated, 3*outputChunk)
	}
	other := &capped{max: outputChunk, budget: b}
	other.Write([]byte("y"))
	if !other.truncated || other.n != 0 {
		t.Errorf("a second exec got %d bytes with the budget spent", other.n)
	}
	c.Free()
	if b.used.Load() != 0 {
		t.Errorf("budget in use after Free: %d", b.used.Load())
	}
	other.truncated = false
	other.Write([]byte("y"))
	if other.truncated || other.n != 1 {
		t.Errorf("after Free: kept %d bytes, truncated %v", other.n, other.truncated)
	}
	other.Free()
}

// writeJSONString must produce what encoding/json decodes back to the
// bytes, with invalid UTF-8 replaced, also across chunk boundaries.
func TestCappedJSONString(t *testing.T) {
	in := bytes.Repeat([]byte("é\"\\\x00<\u2028\xff"), outputChunk/5)
	c := &capped{max: len(in), budget: &outputBudget{max: 1 << 30}}
	c.Write(in)
	defer c.Free()
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	c.writeJSONString(w)
	w.Flush()
	var got string
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("not a JSON string: %v", err)
	}
	if want := string(bytes.ToValidUTF8(in, []byte("\uFFFD"))); got != want {
		t.Errorf("decoded %d bytes, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
