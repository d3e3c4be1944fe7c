package pandastack

// The SDK's public types are what its users program against, with Go
// names, Go types (time.Time, os.FileMode, SandboxState) and Go docs, so
// they are written by hand; the bodies it sends are generated
// (internal/wire). These tests hold the hand-written ones to
// api/openapi.yaml, both ways: every property of a schema has a field and
// every field a property, of the same JSON type, at every level. Every
// struct of the package with JSON tags is checked here or listed in
// notWire with the reason, so a new one cannot be forgotten.

import (
	"reflect"
	"strings"
	"testing"

	apispec "github.com/pandastack/pandastack/api"
	"github.com/pandastack/pandastack/internal/testing/apischema"
)

// wireCheck is a type and where the document describes it: a component
// schema, or an operation's answer ("METHOD /path STATUS").
type wireCheck struct {
	typ               reflect.Type
	component, answer string
	ignore            map[string]string
}

func (c wireCheck) String() string {
	if c.component != "" {
		return c.typ.String() + " vs components/schemas/" + c.component
	}
	return c.typ.String() + " vs the answer of " + c.answer
}

var sdkWire = []wireCheck{
	{typ: reflect.TypeFor[Health](), answer: "GET /healthz 200"},
	{typ: reflect.TypeFor[Error](), component: "ErrorDetail"},
	{typ: reflect.TypeFor[SandboxInfo](), component: "Sandbox"},
	{typ: reflect.TypeFor[Network](), component: "NetworkPolicy"},
	{typ: reflect.TypeFor[NetworkUpdate](), component: "NetworkPolicy"},
	{typ: reflect.TypeFor[forkAnswer](), answer: "POST /v1/sandboxes/{id}/fork 200"},
	{typ: reflect.TypeFor[ExecResult](), component: "ExecResult"},
	{typ: reflect.TypeFor[execEvent](), component: "ExecEvent"},
	{typ: reflect.TypeFor[ProcessInfo](), component: "Process"},
	{typ: reflect.TypeFor[processEvent](), component: "ProcessEvent"},
	{typ: reflect.TypeFor[FileInfo](), component: "FileInfo"},
	{typ: reflect.TypeFor[WatchEvent](), component: "WatchEvent"},
	{typ: reflect.TypeFor[Event](), component: "Event"},
	{typ: reflect.TypeFor[CommandRecord](), component: "Command"},
	{typ: reflect.TypeFor[Snapshot](), component: "Snapshot"},
	{typ: reflect.TypeFor[Volume](), component: "Volume"},
	{typ: reflect.TypeFor[Port](), component: "ListeningPort"},
	{typ: reflect.TypeFor[PortURL](), answer: "POST /v1/sandboxes/{id}/ports/{port}/url 200"},
	{typ: reflect.TypeFor[Host](), component: "Host", ignore: map[string]string{
		"address": "Deprecated: no server sent it; kept so that code reading it compiles",
	}},
	{typ: reflect.TypeFor[DrainResult](), component: "HostDrain"},
	{typ: reflect.TypeFor[APIKey](), component: "APIKey"},
	{typ: reflect.TypeFor[KeyWithSecret](), answer: "POST /v1/keys 201"},
	{typ: reflect.TypeFor[PurgeResult](), answer: "POST /v1/keys/{key_id}/purge 200"},
	{typ: reflect.TypeFor[Template](), component: "Template"},
	{typ: reflect.TypeFor[TemplateBuild](), component: "TemplateBuild"},
	{typ: reflect.TypeFor[codeEvent](), component: "CodeEvent"},
	{typ: reflect.TypeFor[CodeContext](), component: "CodeContext"},
	{typ: reflect.TypeFor[codeContexts](), component: "CodeContextList"},
}

// notWire are the package's structs with JSON tags that the document does
// not describe field by field, and why.
var notWire = map[string]string{
	"progressEvent": "a line of the bake and create progress streams, which the document leaves free-form ({type: object}; described in prose)",
}

func TestWireTypesMatchOpenAPI(t *testing.T) {
	doc, err := apischema.Load(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range sdkWire {
		var s *apischema.Schema
		if c.component != "" {
			s, err = doc.Component(c.component)
		} else {
			i := strings.LastIndexByte(c.answer, ' ')
			s, err = doc.Answer(c.answer[:i], c.answer[i+1:])
		}
		if err != nil {
			t.Errorf("%s: %v", c, err)
			continue
		}
		for _, d := range apischema.Match(c.typ, s, apischema.Options{Ignore: c.ignore}) {
			t.Errorf("%s: %s", c, d)
		}
	}
}

// TestErrorCodesMatchOpenAPI: the SDK knows the status of every error
// code of the document (ErrorDetail.code), as the document's table gives
// it, and no other code.
func TestErrorCodesMatchOpenAPI(t *testing.T) {
	doc, err := apischema.Load(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	enum, err := doc.ErrorCodes()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(codeStatus), len(enum); got != want {
		t.Errorf("codeStatus has %d codes, ErrorDetail.code %d", got, want)
	}
	table := doc.ErrorStatuses()
	for _, c := range enum {
		if got, want := codeStatus[c], table[c]; got != want || got == 0 {
			t.Errorf("code %q: codeStatus says %d, api/openapi.yaml's error table %d", c, got, want)
		}
	}
	for _, c := range codes {
		if codeStatus[c.code] != c.status {
			t.Errorf("code %q: codes says %d, codeStatus %d", c.code, c.status, codeStatus[c.code])
		}
	}
	// A stream's error has its code's status.
	if e := newError(0, "timeout", "took too long"); e.Status != 504 {
		t.Errorf("newError(0, timeout): status %d, want 504", e.Status)
	}
}

// TestEveryWireTypeIsChecked: every named struct of the package with a
// JSON tag is in sdkWire (or in one it holds), or in notWire.
func TestEveryWireTypeIsChecked(t *testing.T) {
	var roots []reflect.Type
	for _, c := range sdkWire {
		roots = append(roots, c.typ)
	}
	unheld, stale, err := apischema.Unheld(".", reflect.TypeFor[Client]().PkgPath(), roots, notWire)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range stale {
		t.Errorf("notWire lists %s, which is no struct with JSON tags here: remove it", name)
	}
	for _, name := range unheld {
		t.Errorf("%s has JSON tags but is not held to api/openapi.yaml: add it to sdkWire in wire_test.go (or to notWire, saying why)", name)
	}
}
