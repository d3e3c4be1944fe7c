package rest

// The handlers' JSON structs are the server's copy of the wire types;
// api/openapi.yaml is the contract (openapi_test.go holds the routes to
// it). These tests hold the structs to the document field by field: every
// property of a schema has a field and every field a property, with the
// same JSON type, at every level; and a property the schema requires is
// never left out (omitempty) of what the server sends. Every named struct
// of this package with JSON tags is either checked here or listed in
// notWire with the reason it is not a REST body, so a new one cannot be
// forgotten.

import (
	"reflect"
	"strings"
	"testing"

	apispec "github.com/pandastack/pandastack/api"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/testing/apischema"
)

// wireCheck is a Go type and where the document describes it.
type wireCheck struct {
	typ reflect.Type
	// One of: a component schema, an operation's request body, an
	// operation's answer ("METHOD /path STATUS"), a JSON pointer.
	component, request, answer, pointer string
	// sent: the server writes it (required properties must always be
	// there); a request body is only read.
	sent   bool
	ignore map[string]string
}

func (c wireCheck) String() string {
	name := c.typ.String()
	switch {
	case c.component != "":
		return name + " vs components/schemas/" + c.component
	case c.request != "":
		return name + " vs the request body of " + c.request
	case c.answer != "":
		return name + " vs the answer of " + c.answer
	}
	return name + " vs " + c.pointer
}

func (c wireCheck) schema(d *apischema.Doc) (*apischema.Schema, error) {
	switch {
	case c.component != "":
		return d.Component(c.component)
	case c.request != "":
		return d.Request(c.request)
	case c.answer != "":
		op, status, _ := strings.Cut(c.answer, " ")
		path, status, _ := strings.Cut(status, " ")
		return d.Answer(op+" "+path, status)
	}
	return d.At(c.pointer)
}

// serverWire lists the handlers' JSON structs and their schemas.
var serverWire = []wireCheck{
	{typ: reflect.TypeFor[errorBody](), component: "Error", sent: true},
	{typ: reflect.TypeFor[errorDetail](), component: "ErrorDetail", sent: true},
	{typ: reflect.TypeFor[sandboxJSON](), answer: "GET /v1/sandboxes/{id} 200", sent: true},
	{typ: reflect.TypeFor[createRequest](), request: "POST /v1/sandboxes"},
	{typ: reflect.TypeFor[eventJSON](), answer: "GET /v1/events 200", sent: true},
	{typ: reflect.TypeFor[commandJSON](), component: "Command", sent: true},
	{typ: reflect.TypeFor[execRequest](), request: "POST /v1/sandboxes/{id}/exec"},
	{typ: reflect.TypeFor[execRequest](), request: "POST /v1/sandboxes/{id}/exec/stream"},
	{typ: reflect.TypeFor[execResult](), answer: "POST /v1/sandboxes/{id}/exec 200", sent: true, ignore: map[string]string{
		"stdout": "exec writes stdout and stderr after the struct's fields, from its capped buffers",
		"stderr": "exec writes stdout and stderr after the struct's fields, from its capped buffers",
	}},
	{typ: reflect.TypeFor[execEvent](), answer: "POST /v1/sandboxes/{id}/exec/stream 200", sent: true},
	{typ: reflect.TypeFor[fileInfoJSON](), component: "FileInfo", sent: true},
	{typ: reflect.TypeFor[forkChildJSON](), sent: true,
		pointer: "#/paths/~1v1~1sandboxes~1{id}~1fork/post/responses/200/content/application~1json/schema/properties/children/items"},
	{typ: reflect.TypeFor[snapshotJSON](), component: "Snapshot", sent: true},
	{typ: reflect.TypeFor[hostJSON](), component: "Host", sent: true, ignore: map[string]string{
		"url": "a fleet's only (fleetHostJSON)", "draining": "a fleet's only (fleetHostJSON)",
		"static": "a fleet's only (fleetHostJSON)", "disk_mib": "a fleet's only (fleetHostJSON)",
		"disk_free_mib": "a fleet's only (fleetHostJSON)", "templates": "a fleet's only (fleetHostJSON)",
		"registered_at": "a fleet's only (fleetHostJSON)", "heartbeat_at": "a fleet's only (fleetHostJSON)",
	}},
	{typ: reflect.TypeFor[fleetHostJSON](), component: "Host", sent: true},
	// Drain and activate answer a map of {id, state, draining} and, with
	// migrate, these.
	{typ: reflect.TypeFor[controlplane.Migrated](), component: "Migrated", sent: true},
	{typ: reflect.TypeFor[purgeJSON](), answer: "POST /v1/keys/{key_id}/purge 200", sent: true},
	{typ: reflect.TypeFor[keyJSON](), component: "APIKey", sent: true, ignore: map[string]string{
		"key": "the secret, in createKey's answer only (checked against it below)",
	}},
	{typ: reflect.TypeFor[keyJSON](), answer: "POST /v1/keys 201"},
	{typ: reflect.TypeFor[portJSON](), component: "ListeningPort", sent: true},
	{typ: reflect.TypeFor[processRequest](), request: "POST /v1/sandboxes/{id}/processes"},
	{typ: reflect.TypeFor[ptySize](), request: "POST /v1/sandboxes/{id}/processes/{pid}/resize"},
	{typ: reflect.TypeFor[processInfo](), component: "Process", sent: true},
	{typ: reflect.TypeFor[processEvent](), answer: "GET /v1/sandboxes/{id}/processes/{pid}/output 200", sent: true},
	{typ: reflect.TypeFor[portURLRequest](), request: "POST /v1/sandboxes/{id}/ports/{port}/url"},
	{typ: reflect.TypeFor[templateJSON](), component: "Template", sent: true},
	{typ: reflect.TypeFor[buildSpec](), request: "POST /v1/templates"},
	{typ: reflect.TypeFor[builds.Status](), component: "TemplateBuild", sent: true},
	{typ: reflect.TypeFor[codeRequest](), request: "POST /v1/sandboxes/{id}/code"},
	{typ: reflect.TypeFor[codeEvent](), answer: "POST /v1/sandboxes/{id}/code 200", sent: true},
	{typ: reflect.TypeFor[codeInterruptRequest](), request: "POST /v1/sandboxes/{id}/code/interrupt"},
	{typ: reflect.TypeFor[codeInterruptResult](), answer: "POST /v1/sandboxes/{id}/code/interrupt 200", sent: true},
	{typ: reflect.TypeFor[codeContextRequest](), request: "POST /v1/sandboxes/{id}/code/contexts"},
	{typ: reflect.TypeFor[codeContextJSON](), answer: "POST /v1/sandboxes/{id}/code/contexts 201", sent: true},
	{typ: reflect.TypeFor[codeContextJSON](), answer: "POST /v1/sandboxes/{id}/code/contexts/{context_id}/restart 200", sent: true},
	{typ: reflect.TypeFor[codeContextList](), answer: "GET /v1/sandboxes/{id}/code/contexts 200", sent: true},
	{typ: reflect.TypeFor[volumeJSON](), component: "Volume", sent: true},
	{typ: reflect.TypeFor[createVolumeRequest](), request: "POST /v1/volumes"},
	{typ: reflect.TypeFor[resizeVolumeRequest](), request: "PATCH /v1/volumes/{name}"},
	{typ: reflect.TypeFor[controlplane.VolumeMountRequest](), component: "VolumeMount"},
}

// notWire are this package's named structs with JSON tags that are not
// bodies of the REST API the document describes, and why.
var notWire = map[string]string{
	"ttyControl":          "text frames of the terminal's WebSocket, described in prose (GET …/tty)",
	"guestExecute":        "the body of the guest's code server's POST /execute (api.md, \"Code interpreter\"), not of this API",
	"guestContextRequest": "the body of the guest's code server's POST /contexts, not of this API",
}

func TestHandlerStructsMatchOpenAPI(t *testing.T) {
	doc, err := apischema.Load(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range serverWire {
		s, err := c.schema(doc)
		if err != nil {
			t.Errorf("%s: %v", c, err)
			continue
		}
		for _, d := range apischema.Match(c.typ, s, apischema.Options{Sent: c.sent, Ignore: c.ignore}) {
			t.Errorf("%s: %s", c, d)
		}
	}
}

// TestErrorCodesMatchOpenAPI: the codes of the server's error answers
// (the kinds that have an HTTP status) are ErrorDetail's codes in the
// document, both ways, with the status the document's table gives.
func TestErrorCodesMatchOpenAPI(t *testing.T) {
	doc, err := apischema.Load(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	enum, err := doc.ErrorCodes()
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, c := range enum {
		documented[c] = true
	}
	table := doc.ErrorStatuses()
	answered := map[string]bool{}
	for k := range statuses {
		if k == controlplane.Canceled {
			continue // the client went away: nobody reads that answer
		}
		answered[string(k)] = true
		if !documented[string(k)] {
			t.Errorf("the server answers errors with code %q (HTTP %d), which ErrorDetail.code in api/openapi.yaml does not list", k, statuses[k])
		}
		if st, ok := table[string(k)]; !ok || st != statuses[k] {
			t.Errorf("the server answers code %q with HTTP %d; the error table of api/openapi.yaml's description says %d (0: no row)", k, statuses[k], st)
		}
	}
	for c := range table {
		if !documented[c] {
			t.Errorf("the error table of api/openapi.yaml's description has %q, which ErrorDetail.code does not list", c)
		}
	}
	for c := range documented {
		if !answered[c] {
			t.Errorf("ErrorDetail.code in api/openapi.yaml lists %q, which no error kind of the server has", c)
		}
	}
}

// TestEveryHandlerStructIsChecked: every named struct type of the package
// with a JSON tag is in serverWire (or in one it holds), or in notWire.
func TestEveryHandlerStructIsChecked(t *testing.T) {
	var roots []reflect.Type
	for _, c := range serverWire {
		roots = append(roots, c.typ)
	}
	unheld, stale, err := apischema.Unheld(".", reflect.TypeFor[Server]().PkgPath(), roots, notWire)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range stale {
		t.Errorf("notWire lists %s, which is no struct with JSON tags here: remove it", name)
	}
	for _, name := range unheld {
		t.Errorf("%s has JSON tags but is not held to api/openapi.yaml: add it to serverWire in wire_test.go (or to notWire, saying why it is no REST body)", name)
	}
}
