package pandastack

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestReadCodeStream: a code stream becomes an Execution, the callbacks
// see the events in order, images are decoded and the raw MIME map kept.
func TestReadCodeStream(t *testing.T) {
	stream := strings.Join([]string{
		`{"type":"stdout","text":"a\n"}`,
		`{"type":"result","is_main_result":false,"data":{"image/png":"iVBORw0KGgo=","text/plain":"<Figure>"},"chart":{"type":"line"}}`,
		`{"type":"stderr","text":"warn\n"}`,
		`{"type":"future_event","x":1}`,
		``,
		`{"type":"result","is_main_result":true,"data":{"text/plain":"2","application/json":{"a":1},"application/vnd.pandastack.data+json":{"x":[1]},"application/vnd.custom":"c"}}`,
		`{"type":"error","name":"ValueError","value":"bad","traceback":"Traceback\nValueError: bad"}`,
		`{"type":"end","execution_count":3,"context_id":"ctx","duration_ms":1500,"truncated":true}`,
		`{"type":"stdout","text":"never read"}`,
	}, "\n")
	var order []string
	ex, err := readCodeStream(strings.NewReader(stream), RunCodeOptions{
		OnStdout: func(s string) { order = append(order, "stdout:"+s) },
		OnStderr: func(s string) { order = append(order, "stderr:"+s) },
		OnResult: func(r Result) { order = append(order, "result:"+r.Text) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order, "|"), "stdout:a\n|result:<Figure>|stderr:warn\n|result:2"; got != want {
		t.Errorf("callbacks: got %q, want %q", got, want)
	}
	if len(ex.Results) != 2 {
		t.Fatalf("got %d results, want 2", len(ex.Results))
	}
	fig, main := ex.Results[0], ex.Results[1]
	if !bytes.Equal(fig.PNG, []byte("\x89PNG\r\n\x1a\n")) || fig.IsMainResult || string(fig.Chart) != `{"type":"line"}` {
		t.Errorf("figure: PNG %q, main %v, chart %s", fig.PNG, fig.IsMainResult, fig.Chart)
	}
	if !main.IsMainResult || main.Text != "2" || string(main.JSON) != `{"a":1}` || string(main.DataFrame) != `{"x":[1]}` ||
		string(main.Data["application/vnd.custom"]) != `"c"` || ex.Text() != "2" {
		t.Errorf("main result: %+v", main)
	}
	if got := strings.Join(main.Formats(), " "); got != "application/json application/vnd.custom application/vnd.pandastack.data+json text/plain" {
		t.Errorf("formats: %s", got)
	}
	if ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Error() != "ValueError: bad" || !strings.Contains(ex.Error.Traceback, "\n") {
		t.Errorf("error: %+v", ex.Error)
	}
	if ex.ExecutionCount != 3 || ex.ContextID != "ctx" || ex.Duration.Milliseconds() != 1500 || !ex.Truncated {
		t.Errorf("end: %+v", ex)
	}
	if strings.Join(ex.Logs.Stdout, "") != "a\n" || strings.Join(ex.Logs.Stderr, "") != "warn\n" {
		t.Errorf("logs: %+v", ex.Logs)
	}
}

// TestReadCodeStreamEnds: how a stream without end ends RunCode.
func TestReadCodeStreamEnds(t *testing.T) {
	tests := []struct {
		name, stream string
		check        func(*Execution, error) error
	}{
		{"cut", `{"type":"stdout","text":"a"}`, func(ex *Execution, err error) error {
			if !errors.Is(err, ErrStreamEnded) || len(ex.Logs.Stdout) != 1 {
				return errors.New("want ErrStreamEnded with the output so far")
			}
			return nil
		}},
		{"guest error", `{"type":"stdout","text":"a"}` + "\n" + `{"type":"error","name":"GuestError","value":"the sandbox's code interpreter sent junk","traceback":""}`,
			func(ex *Execution, err error) error {
				var e *Error
				if !errors.As(err, &e) || e.Code != "guest_error" || e.Status != 502 || !strings.Contains(e.Message, "junk") {
					return errors.New("want an *Error guest_error with the message")
				}
				return nil
			}},
		{"server's timeout", `{"type":"error","name":"TimeoutError","value":"the cell ran past its timeout","traceback":""}`,
			func(ex *Execution, err error) error {
				if err != nil || ex.Error == nil || ex.Error.Name != "TimeoutError" {
					return errors.New("want the Execution with a TimeoutError, no Go error")
				}
				return nil
			}},
		{"not JSON", "<html>", func(ex *Execution, err error) error {
			if err == nil || errors.Is(err, ErrStreamEnded) {
				return errors.New("want a decode error")
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex, err := readCodeStream(strings.NewReader(tt.stream), RunCodeOptions{})
			if cerr := tt.check(ex, err); cerr != nil {
				t.Errorf("got %+v, %v: %v", ex, err, cerr)
			}
		})
	}
}
