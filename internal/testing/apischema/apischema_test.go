package apischema

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

const doc = `
openapi: 3.0.3
info:
  description: |
    | status | code | when |
    |---|---|---|
    | 404 | not_found | unknown |
    | 429 | too_many_requests | busy |
paths:
  /v1/things:
    post:
      requestBody:
        content:
          application/json:
            schema: {$ref: "#/components/schemas/Thing"}
      responses:
        "201":
          content:
            application/json:
              schema:
                allOf:
                  - $ref: "#/components/schemas/Thing"
                  - type: object
                    required: [secret]
                    properties:
                      secret: {type: string}
        "400": {$ref: "#/components/responses/Error"}
components:
  responses:
    Error:
      content:
        application/json:
          schema: {$ref: "#/components/schemas/Error"}
  schemas:
    Error:
      type: object
      properties:
        error:
          type: object
          required: [code]
          properties:
            code: {type: string}
    Thing:
      type: object
      required: [id, made_at]
      properties:
        id: {type: string}
        size: {type: integer}
        made_at: {type: string, format: date-time}
        labels: {type: object, additionalProperties: {type: string}}
        parts:
          type: array
          items:
            type: object
            properties:
              n: {type: number}
        where: {oneOf: [{type: string}, {type: object}]}
`

type part struct {
	N float64 `json:"n"`
}

type thing struct {
	ID     string            `json:"id"`
	Size   int64             `json:"size,omitempty"`
	MadeAt time.Time         `json:"made_at"`
	Labels map[string]string `json:"labels,omitempty"`
	Parts  []part            `json:"parts"`
	Where  any               `json:"where"`
	local  int
}

func load(t *testing.T) *Doc {
	t.Helper()
	d, err := Load([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestMatchAgrees(t *testing.T) {
	d := load(t)
	req, err := d.Request("POST /v1/things")
	if err != nil {
		t.Fatal(err)
	}
	if diffs := Match(reflect.TypeFor[thing](), req, Options{Sent: true}); len(diffs) > 0 {
		t.Errorf("got differences %q, want none", diffs)
	}
	// allOf merges the parts: the answer has secret too, and requires it.
	type withSecret struct {
		thing
		Secret string `json:"secret"`
	}
	ans, err := d.Answer("POST /v1/things", "201")
	if err != nil {
		t.Fatal(err)
	}
	if !ans.Required["secret"] || !ans.Required["id"] {
		t.Errorf("allOf's required: got %v, want id, made_at and secret", ans.Required)
	}
	if diffs := Match(reflect.TypeFor[withSecret](), ans, Options{Sent: true}); len(diffs) > 0 {
		t.Errorf("got differences %q, want none", diffs)
	}
	// An answer given by a $ref to components/responses.
	e, err := d.Answer("POST /v1/things", "400")
	if err != nil {
		t.Fatal(err)
	}
	type errorBody struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if diffs := Match(reflect.TypeFor[errorBody](), e, Options{}); len(diffs) > 0 {
		t.Errorf("error body: got differences %q, want none", diffs)
	}
}

func TestMatchFindsDifferences(t *testing.T) {
	d := load(t)
	s, err := d.Component("Thing")
	if err != nil {
		t.Fatal(err)
	}
	type drifted struct {
		ID     int               `json:"id"`               // integer, not string
		MadeAt time.Time         `json:"made_at,omitzero"` // required but omitted
		Labels map[string]int    `json:"labels"`           // values of another type
		Parts  []struct{ M int } `json:"parts"`            // n missing, M extra
		Extra  bool              `json:"extra"`            // not in the schema
		Where  string            `json:"where"`            // a oneOf: not compared
	}
	got := Match(reflect.TypeFor[drifted](), s, Options{Sent: true, Ignore: map[string]string{"gone": "test"}})
	want := []string{
		"extra: Go has the field Extra, the schema has no such property",
		"gone: ignored, but neither the Go type nor the schema has it (remove it from the ignore list)",
		"id: Go has int (a JSON integer), the schema a string",
		"labels: Go has int (a JSON integer), the schema a string",
		"made_at: the schema requires it, but Go's field MadeAt is omitzero: the server leaves it out when it is empty",
		"parts.M: Go has the field M, the schema has no such property",
		"parts.n: the schema has this property, Go's struct { M int } has no field for it",
		"size: the schema has this property, Go's apischema.drifted has no field for it",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got differences\n%q\nwant\n%q", got, want)
	}
	// Ignored properties are not compared, on either side.
	got = Match(reflect.TypeFor[drifted](), s, Options{Ignore: map[string]string{
		"extra": "", "id": "", "labels": "", "parts": "", "size": "",
	}})
	if len(got) > 0 {
		t.Errorf("with the differences ignored: got %q, want none", got)
	}
}

func TestErrorStatuses(t *testing.T) {
	got := load(t).ErrorStatuses()
	want := map[string]int{"not_found": 404, "too_many_requests": 429}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestErrors(t *testing.T) {
	d := load(t)
	for _, tc := range []struct {
		name string
		f    func() error
	}{
		{"unknown path", func() error { _, err := d.Request("GET /v1/nothing"); return err }},
		{"unknown method", func() error { _, err := d.Request("DELETE /v1/things"); return err }},
		{"unknown status", func() error { _, err := d.Answer("POST /v1/things", "418"); return err }},
		{"unknown component", func() error { _, err := d.Component("Nothing"); return err }},
		{"no method", func() error { _, err := d.Request("/v1/things"); return err }},
	} {
		if err := tc.f(); err == nil {
			t.Errorf("%s: got no error", tc.name)
		}
	}
}
