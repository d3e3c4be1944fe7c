package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	spec     = "../../openapi.yaml"
	jsonCopy = "../../../sdk/python/tests/openapi.json"
)

// TestCopyIsCurrent: the committed JSON copy is the document now.
func TestCopyIsCurrent(t *testing.T) {
	doc, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	want, err := convert(doc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(jsonCopy)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("sdk/python/tests/openapi.json is not api/openapi.yaml as JSON: run `make generate` and commit it")
	}
}

// TestConvertKeepsEverything: the JSON holds what the YAML holds, anchors
// expanded.
func TestConvertKeepsEverything(t *testing.T) {
	doc := []byte("a: &x {b: [1, \"2\", true, null]}\nc: *x\nd: |\n  <text> & more\n")
	out, err := convert(doc)
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the output is not JSON: %v\n%s", err, out)
	}
	if err := yaml.Unmarshal(doc, &want); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if !bytes.Equal(gb, wb) {
		t.Errorf("got %s, want %s", gb, wb)
	}
	if !bytes.Contains(out, []byte(`"<text> & more\n"`)) {
		t.Errorf("HTML characters were escaped: %s", out)
	}
}
