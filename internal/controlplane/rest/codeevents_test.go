package rest

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// encodeEvents is evs as the API's stream would have them, one JSON line
// each.
func encodeEvents(t *testing.T, evs []codeEvent) string {
	t.Helper()
	var b strings.Builder
	for _, ev := range evs {
		line, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestCodeStreamLine: each line of the guest's stream becomes the API's
// events, or ends the stream as a broken protocol.
func TestCodeStreamLine(t *testing.T) {
	tests := []struct {
		name string
		line string
		want string // the events as JSON lines
		err  string // a substring of the protocol error
	}{
		{name: "stdout", line: `{"type":"stdout","text":"hi\n","timestamp":1700000000000000000}`,
			want: `{"type":"stdout","text":"hi\n"}` + "\n"},
		{name: "stderr", line: `{"type":"stderr","text":"oops"}`, want: `{"type":"stderr","text":"oops"}` + "\n"},
		{name: "empty stdout keeps its text", line: `{"type":"stdout","text":""}`, want: `{"type":"stdout","text":""}` + "\n"},
		{name: "every result key", line: `{"type":"result","is_main_result":true,"text":"2","html":"<b>2</b>","markdown":"**2**",` +
			`"svg":"<svg/>","png":"iVBORw0KGgo=","jpeg":"/9j/4A==","pdf":"JVBERi0=","latex":"$2$","json":{"a":[1,2]},` +
			`"javascript":"console.log(2)","data":{"x":[1,2]},"chart":{"type":"line","elements":[]}}`,
			want: `{"type":"result","is_main_result":true,"data":{"application/javascript":"console.log(2)","application/json":{"a":[1,2]},` +
				`"application/pdf":"JVBERi0=","application/vnd.pandastack.data+json":{"x":[1,2]},"image/jpeg":"/9j/4A==",` +
				`"image/png":"iVBORw0KGgo=","image/svg+xml":"\u003csvg/\u003e","text/html":"\u003cb\u003e2\u003c/b\u003e","text/latex":"$2$",` +
				`"text/markdown":"**2**","text/plain":"2"},"chart":{"type":"line","elements":[]}}` + "\n"},
		{name: "display data is not main", line: `{"type":"result","is_main_result":false,"png":"iVBORw0KGgo="}`,
			want: `{"type":"result","is_main_result":false,"data":{"image/png":"iVBORw0KGgo="}}` + "\n"},
		{name: "missing is_main_result is false", line: `{"type":"result","text":"1"}`,
			want: `{"type":"result","is_main_result":false,"data":{"text/plain":"1"}}` + "\n"},
		{name: "base64 with line breaks", line: `{"type":"result","png":"iVBO\nRw0K\r\nGgo="}`,
			want: `{"type":"result","is_main_result":false,"data":{"image/png":"iVBO\nRw0K\r\nGgo="}}` + "\n"},
		{name: "extra MIME types", line: `{"type":"result","is_main_result":true,"text":"x","extra":{"application/vnd.plotly.v1+json":{"data":[]},"text/plain":"dup"}}`,
			want: `{"type":"result","is_main_result":true,"data":{"application/vnd.plotly.v1+json":{"data":[]},"text/plain":"x"}}` + "\n"},
		{name: "nulls and unknown keys are dropped", line: `{"type":"result","text":null,"html":"h","graph":{"x":1},"extra":null,"chart":null}`,
			want: `{"type":"result","is_main_result":false,"data":{"text/html":"h"}}` + "\n"},
		{name: "error", line: `{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback…\nZeroDivisionError"}`,
			want: `{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback…\nZeroDivisionError"}` + "\n"},
		{name: "error without a name", line: `{"type":"error","value":"x"}`,
			want: `{"type":"error","name":"Error","value":"x","traceback":""}` + "\n"},
		{name: "blank line", line: "  ", want: ""},
		{name: "execution count", line: `{"type":"number_of_executions","execution_count":3}`, want: ""},

		{name: "not JSON", line: `hello`, err: "not a JSON object"},
		{name: "JSON but not an object", line: `[1,2]`, err: "not a JSON object"},
		{name: "null", line: `null`, err: "not a JSON object"},
		{name: "no type", line: `{"text":"x"}`, err: "without a type"},
		{name: "type not a string", line: `{"type":7}`, err: "type is not a string"},
		{name: "unknown type", line: `{"type":"launch_missiles"}`, err: `unknown type "launch_missiles"`},
		{name: "unknown type, hostile name", line: `{"type":"` + strings.Repeat(`\u001b[31m`, 40) + `"}`, err: "unknown type"},
		{name: "stdout text not a string", line: `{"type":"stdout","text":{"a":1}}`, err: "text is not a string"},
		{name: "result text not a string", line: `{"type":"result","text":5}`, err: "text is not a string"},
		{name: "result png not base64", line: `{"type":"result","png":"<script>"}`, err: "png is not base64"},
		{name: "result png padding in the middle", line: `{"type":"result","png":"ab=cd"}`, err: "png is not base64"},
		{name: "result main not a boolean", line: `{"type":"result","is_main_result":"yes"}`, err: "is_main_result is not a boolean"},
		{name: "result data not an object", line: `{"type":"result","data":[1]}`, err: "data is not an object"},
		{name: "result chart not an object", line: `{"type":"result","chart":"x"}`, err: "chart is not an object"},
		{name: "result extra not an object", line: `{"type":"result","extra":[1]}`, err: "extra is not an object"},
		{name: "result extra not a MIME type", line: `{"type":"result","extra":{"not a mime":"x"}}`, err: "not one"},
		{name: "error name not a string", line: `{"type":"error","name":["x"]}`, err: "name is not a string"},
		{name: "count not a number", line: `{"type":"number_of_executions","execution_count":"3"}`, err: "not a count"},
		{name: "count negative", line: `{"type":"number_of_executions","execution_count":-1}`, err: "not a count"},
		{name: "count fractional", line: `{"type":"number_of_executions","execution_count":1.5}`, err: "not a count"},
		{name: "count missing", line: `{"type":"number_of_executions"}`, err: "not a count"},
		{name: "end with a bad context id", line: `{"type":"end_of_execution","context_id":"../../etc"}`, err: "invalid id"},
		{name: "end with a bad duration", line: `{"type":"end_of_execution","duration_ms":"long"}`, err: "not a count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &codeStream{maxOutput: 1 << 20}
			evs, err := c.line([]byte(tt.line), 0)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("line %s: got error %v, want one with %q", tt.line, err, tt.err)
				}
				if !utf8.ValidString(err.Error()) || strings.ContainsAny(err.Error(), "\x1b\n") {
					t.Errorf("error %q holds control characters or invalid UTF-8 of the guest", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("line %s: %v", tt.line, err)
			}
			if got := encodeEvents(t, evs); got != tt.want {
				t.Errorf("line %s:\ngot  %s\nwant %s", tt.line, got, tt.want)
			}
		})
	}
}

// TestCodeStreamEnd: end carries the execution count, the context (the
// guest's, else the request's), the duration (the guest's, else the
// server's) and whether output was cut.
func TestCodeStreamEnd(t *testing.T) {
	tests := []struct {
		name     string
		request  string // the request's context id
		lines    []string
		duration int64 // the server's measure
		want     string
	}{
		{name: "the guest's", lines: []string{`{"type":"number_of_executions","execution_count":4}`,
			`{"type":"end_of_execution","context_id":"ctx_1","duration_ms":12}`}, duration: 99,
			want: `{"type":"end","execution_count":4,"context_id":"ctx_1","duration_ms":12,"truncated":false}`},
		{name: "E2B's bare end", request: "mine", lines: []string{`{"type":"end_of_execution"}`}, duration: 99,
			want: `{"type":"end","execution_count":0,"context_id":"mine","duration_ms":99,"truncated":false}`},
		{name: "the guest's cap", lines: []string{`{"type":"stderr","text":"` + guestTruncatedMarker + `"}`, `{"type":"end_of_execution"}`},
			want: `{"type":"end","execution_count":0,"context_id":"","duration_ms":0,"truncated":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &codeStream{maxOutput: 1 << 20, contextID: tt.request}
			var last []codeEvent
			for _, l := range tt.lines {
				evs, err := c.line([]byte(l), tt.duration)
				if err != nil {
					t.Fatalf("line %s: %v", l, err)
				}
				last = evs
			}
			if !c.ended {
				t.Fatal("the stream did not end")
			}
			if got := strings.TrimSpace(encodeEvents(t, last)); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestCodeStreamOutputCap: stdout and stderr together are forwarded up to
// the cap, cut on a character boundary, then one marker, then nothing;
// results and errors still pass, and end says truncated.
func TestCodeStreamOutputCap(t *testing.T) {
	c := &codeStream{maxOutput: 10}
	var got []codeEvent
	for _, l := range []string{
		`{"type":"stdout","text":"12345"}`,
		`{"type":"stderr","text":"abc"}`,
		`{"type":"stdout","text":"xé€z"}`, // 1 + 2 + 3 + 1 bytes: "x" fits, "é" does not
		`{"type":"stdout","text":"more"}`,
		`{"type":"stderr","text":"more"}`,
		`{"type":"result","is_main_result":true,"text":"1"}`,
		`{"type":"error","name":"E","value":"v","traceback":""}`,
		`{"type":"end_of_execution"}`,
	} {
		evs, err := c.line([]byte(l), 0)
		if err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		got = append(got, evs...)
	}
	var types, texts []string
	markers := 0
	for _, ev := range got {
		types = append(types, ev.Type)
		if ev.Text != nil {
			texts = append(texts, *ev.Text)
			if strings.HasPrefix(*ev.Text, "[output truncated") {
				markers++
			}
		}
	}
	if want := "stdout stderr stdout stderr result error end"; strings.Join(types, " ") != want {
		t.Errorf("got events %s, want %s", strings.Join(types, " "), want)
	}
	if len(texts) < 3 || texts[0] != "12345" || texts[1] != "abc" || texts[2] != "x" {
		t.Errorf("got texts %q, want 12345, abc, x (the cap cuts between characters)", texts)
	}
	if markers != 1 {
		t.Errorf("got %d truncation markers, want 1", markers)
	}
	if end := got[len(got)-1]; end.Truncated == nil || !*end.Truncated {
		t.Errorf("end says truncated %v, want true", end.Truncated)
	}
}

// TestCodeStreamOutputCapExact: output that reaches the cap exactly at a
// line's end gets its one marker with the next line (a kernel flushing
// 1 MiB at a time reaches 16 MiB so).
func TestCodeStreamOutputCapExact(t *testing.T) {
	c := &codeStream{maxOutput: 10}
	var texts []string
	for _, l := range []string{
		`{"type":"stdout","text":"12345"}`,
		`{"type":"stdout","text":"67890"}`,
		`{"type":"stdout","text":"more"}`,
		`{"type":"stderr","text":"more"}`,
		`{"type":"end_of_execution"}`,
	} {
		evs, err := c.line([]byte(l), 0)
		if err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		for _, ev := range evs {
			if ev.Text != nil {
				texts = append(texts, ev.Type+":"+*ev.Text)
			}
			if ev.Type == "end" && (ev.Truncated == nil || !*ev.Truncated) {
				t.Errorf("end says truncated %v, want true", ev.Truncated)
			}
		}
	}
	want := "stdout:12345|stdout:67890|stderr:[output truncated: the cell wrote more than 10 bytes; the rest of its output is dropped]"
	if got := strings.Join(texts, "|"); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestReadLine: lines are bounded, a last line without a newline counts,
// and a line over the bound is refused without being kept.
func TestReadLine(t *testing.T) {
	br := bufio.NewReaderSize(strings.NewReader("a\n"+strings.Repeat("b", 100)+"\nlast"), 16)
	for _, want := range []string{"a", strings.Repeat("b", 100), "last"} {
		got, err := readLine(br, 100)
		if err != nil || string(got) != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
	if _, err := readLine(br, 100); !errors.Is(err, io.EOF) {
		t.Errorf("after the last line: got %v, want EOF", err)
	}
	br = bufio.NewReaderSize(strings.NewReader(strings.Repeat("c", 1000)+"\n"), 16)
	if _, err := readLine(br, 100); !errors.Is(err, errLineTooLong) {
		t.Errorf("a line of 1000 bytes with a bound of 100: got %v, want errLineTooLong", err)
	}
}

// TestCodeValidation: context ids, MIME types, languages and bounded
// messages.
func TestCodeValidation(t *testing.T) {
	for id, want := range map[string]bool{
		"python": true, "a": true, "A-b_9": true, strings.Repeat("x", 64): true,
		"": false, strings.Repeat("x", 65): false, "../x": false, "a/b": false, "a b": false, "a%2F": false, "é": false, "a\x00": false,
	} {
		if got := validContextID(id); got != want {
			t.Errorf("validContextID(%q) = %v, want %v", id, got, want)
		}
	}
	for m, want := range map[string]bool{
		"text/plain": true, "application/vnd.plotly.v1+json": true, "x-a/b*c%d'e`f|g~h": true,
		"text": false, "/x": false, "x/": false, "a/b/c": false, "text/plain; charset=utf-8": false, strings.Repeat("a", 200) + "/" + strings.Repeat("b", 60): false,
	} {
		if got := validMIME(m); got != want {
			t.Errorf("validMIME(%q) = %v, want %v", m, got, want)
		}
	}
	for in, want := range map[string]string{"python": "python", "Py": "python", "python3": "python", "js": "javascript",
		"node": "javascript", "nodejs": "javascript", "javascript": "javascript", "sh": "bash", "shell": "bash", "bash": "bash", "": ""} {
		if got, err := canonicalLanguage(in); err != nil || got != want {
			t.Errorf("canonicalLanguage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := canonicalLanguage("cobol"); err == nil || !strings.Contains(err.Error(), `unknown language "cobol": python, javascript, bash`) {
		t.Errorf("canonicalLanguage(cobol): got %v", err)
	}
	if got := bounded("a\x1b[31mb\nc\u2028d", 100); got != "a [31mb c d" {
		t.Errorf("bounded: got %q", got)
	}
	if got := bounded(strings.Repeat("é", 10), 5); got != "éé…" {
		t.Errorf("bounded cuts between characters: got %q", got)
	}
	if got := bounded("\xff\xfe", 10); got != "\uFFFD" {
		t.Errorf("bounded makes UTF-8 valid: got %q", got)
	}
}

// TestCodeRequestToGuest: the request's validation and what the guest is
// asked.
func TestCodeRequestToGuest(t *testing.T) {
	code := "1+1"
	n := func(i int) *int { return &i }
	tests := []struct {
		name string
		req  codeRequest
		want string // the guest's body, or the error
	}{
		{name: "defaults", req: codeRequest{Code: &code}, want: `{"code":"1+1","timeout_ms":300000}`},
		{name: "all", req: codeRequest{Code: &code, Language: "JS", Env: map[string]string{"A": "b"}, TimeoutSeconds: n(5)},
			want: `{"code":"1+1","language":"javascript","env_vars":{"A":"b"},"timeout_ms":5000}`},
		{name: "context", req: codeRequest{Code: &code, ContextID: "c1"}, want: `{"code":"1+1","context_id":"c1","timeout_ms":300000}`},
		{name: "no code", req: codeRequest{}, want: "code is required"},
		{name: "both", req: codeRequest{Code: &code, Language: "python", ContextID: "c1"}, want: "not both"},
		{name: "unknown language", req: codeRequest{Code: &code, Language: "cobol"}, want: "unknown language"},
		{name: "bad context", req: codeRequest{Code: &code, ContextID: "../x"}, want: "is not a context id"},
		{name: "timeout 0", req: codeRequest{Code: &code, TimeoutSeconds: n(0)}, want: "timeout_seconds must be between 1 and 3600"},
		{name: "timeout too long", req: codeRequest{Code: &code, TimeoutSeconds: n(3601)}, want: "timeout_seconds must be between 1 and 3600"},
		{name: "bad env", req: codeRequest{Code: &code, Env: map[string]string{"": "x"}}, want: "env entry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _, err := tt.req.toGuest()
			got := ""
			if err != nil {
				got = err.Error()
			} else {
				b, _ := json.Marshal(g)
				got = string(b)
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}
