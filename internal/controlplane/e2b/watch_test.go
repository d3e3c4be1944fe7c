package e2b

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

func TestWatchEvents(t *testing.T) {
	for _, tc := range []struct {
		root string
		ev   guestproto.WatchEvent
		want []filesystemEvent
	}{
		{"/w", guestproto.WatchEvent{Type: "create", Path: "/w/a"}, []filesystemEvent{{"a", eventCreate}}},
		{"/w", guestproto.WatchEvent{Type: "write", Path: "/w/sub/a"}, []filesystemEvent{{"sub/a", eventWrite}}},
		{"/w", guestproto.WatchEvent{Type: "remove", Path: "/w/a", IsDir: true}, []filesystemEvent{{"a", eventRemove}}},
		{"/w", guestproto.WatchEvent{Type: "chmod", Path: "/w/a"}, []filesystemEvent{{"a", eventChmod}}},
		{"/w", guestproto.WatchEvent{Type: "rename", Path: "/w/b", OldPath: "/w/a"},
			[]filesystemEvent{{"a", eventRename}, {"b", eventCreate}}},
		{"/w", guestproto.WatchEvent{Type: "rename", Path: "/w/b"}, []filesystemEvent{{"b", eventCreate}}},
		{"/w", guestproto.WatchEvent{Type: "overflow"}, nil},
		{"/w", guestproto.WatchEvent{Type: "create", Path: "/wx/a"}, []filesystemEvent{{"/wx/a", eventCreate}}},
		{"/", guestproto.WatchEvent{Type: "create", Path: "/a"}, []filesystemEvent{{"a", eventCreate}}},
	} {
		if got := watchEvents(tc.root, tc.ev); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("watchEvents(%q, %+v) = %+v, want %+v", tc.root, tc.ev, got, tc.want)
		}
	}
}

// TestPTYMessages holds the PTY and watch messages to envd's JSON names.
func TestPTYMessages(t *testing.T) {
	var start startRequest
	if err := json.Unmarshal([]byte(`{"process":{"cmd":"/bin/bash","args":["-i","-l"]},"pty":{"size":{"cols":80,"rows":24}}}`), &start); err != nil {
		t.Fatal(err)
	}
	if start.PTY == nil || start.PTY.Size != (ptySize{Cols: 80, Rows: 24}) {
		t.Errorf("start pty = %+v, want 80x24", start.PTY)
	}
	var up updateRequest
	if err := json.Unmarshal([]byte(`{"process":{"pid":7},"pty":{"size":{"cols":100,"rows":40}}}`), &up); err != nil {
		t.Fatal(err)
	}
	if *up.Process.PID != 7 || up.PTY.Size != (ptySize{Cols: 100, Rows: 40}) {
		t.Errorf("update = %+v, want pid 7, 100x40", up)
	}
	var in sendInputRequest
	if err := json.Unmarshal([]byte(`{"process":{"pid":7},"input":{"pty":"aGkN"}}`), &in); err != nil {
		t.Fatal(err)
	}
	if string(in.Input.PTY) != "hi\r" {
		t.Errorf("pty input = %q, want %q", in.Input.PTY, "hi\r")
	}
	for _, tc := range []struct {
		v    any
		want string
	}{
		{processEvent{Data: &dataEvent{PTY: []byte("hi")}}, `{"data":{"pty":"aGk="}}`},
		{watchDirResponse{Start: &struct{}{}}, `{"start":{}}`},
		{watchDirResponse{Filesystem: &filesystemEvent{Name: "a", Type: eventCreate}}, `{"filesystem":{"name":"a","type":"EVENT_TYPE_CREATE"}}`},
		{watchDirResponse{Keepalive: &struct{}{}}, `{"keepalive":{}}`},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("marshal %+v = %s, want %s", tc.v, b, tc.want)
		}
	}
}
