// Package api holds PandaStack's public contracts as files: the REST API's
// OpenAPI document (openapi.yaml, served at /v1/openapi.yaml) and the
// host↔guest protocol description (guest-protocol.md).
package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of the REST API.
//
//go:embed openapi.yaml
var OpenAPI []byte
