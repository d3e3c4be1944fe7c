// Package wire is the REST API's wire types for the Go SDK, generated from
// api/openapi.yaml (wire.gen.go; do not edit it): the bodies the SDK sends
// are these types, so the document is their one source. oapi-codegen's
// settings are in oapi-codegen.yaml; overlay.yaml adapts the document to
// what the SDK needs of it without changing it (see there why).
//
// Regenerate after changing the document: `make generate` (or `go
// generate ./sdk/go/...`). wire_test.go fails while wire.gen.go is not
// what the document generates.
package wire

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml -o wire.gen.go ../../../../api/openapi.yaml
