// Package api holds PandaStack's public contracts as files: the REST API's
// OpenAPI document (openapi.yaml, served at /v1/openapi.yaml) and the
// host↔guest protocol description (guest-protocol.md).
package api

import _ "embed"

// The JSON copy of openapi.yaml that the Python SDK's tests read (their
// standard library has no YAML parser); internal/specjson's test fails
// while it is stale.
//
//go:generate go run ./internal/specjson openapi.yaml ../sdk/python/tests/openapi.json

// OpenAPI is the OpenAPI 3 document of the REST API.
//
//go:embed openapi.yaml
var OpenAPI []byte
