// Command specjson writes the OpenAPI document (api/openapi.yaml) as JSON,
// for the tests that cannot read YAML: the Python SDK's
// (sdk/python/tests/openapi.json; Python's standard library has no YAML
// parser, and the SDK takes no dependency). The copy is committed, so
// that those tests run without Go; this package's test fails while it is
// not the document. Run by `make generate` (go generate ./api/...):
//
//	go run ./internal/specjson openapi.yaml ../sdk/python/tests/openapi.json
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"gopkg.in/yaml.v3"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "specjson:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: specjson openapi.yaml openapi.json")
	}
	in, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	out, err := convert(in)
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	return os.WriteFile(args[1], out, 0o644)
}

// convert returns the YAML document doc as indented JSON, keys sorted
// (encoding/json sorts a map's), anchors and aliases expanded.
func convert(doc []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode as JSON: %w", err)
	}
	return b.Bytes(), nil
}
