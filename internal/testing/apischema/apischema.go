// Package apischema reads the REST API's OpenAPI document
// (api/openapi.yaml) for the tests that hold wire types to it: the
// schema of a component, of an operation's request body or of its answer,
// with $ref and allOf resolved; and Match, which compares a Go type's JSON
// fields with a schema, both ways. The server's handler structs
// (internal/controlplane/rest) and the Go SDK's types (sdk/go) are held to
// the document with it; the Python SDK's models have a twin of it in
// sdk/python/tests.
package apischema

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Doc is an OpenAPI 3 document.
type Doc struct {
	root map[string]any
}

// Load parses an OpenAPI document (YAML or JSON).
func Load(b []byte) (*Doc, error) {
	var root map[string]any
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("parse the OpenAPI document: %w", err)
	}
	if _, ok := root["paths"].(map[string]any); !ok {
		return nil, fmt.Errorf("parse the OpenAPI document: it has no paths")
	}
	return &Doc{root: root}, nil
}

// Schema is a schema of the document, resolved: $ref followed, allOf
// merged, nested schemas resolved too.
type Schema struct {
	// Type is object, array, string, integer, number or boolean; "" for
	// any value and for a oneOf.
	Type     string
	Format   string // date-time, ...
	Nullable bool
	OneOf    bool // a union of several schemas: Match compares no further
	// Properties are an object's (allOf's parts merged), Required the
	// names among them it always has.
	Properties map[string]*Schema
	Required   map[string]bool
	Items      *Schema // an array's items
	Values     *Schema // an object's additionalProperties (a map)
	// Enum are the values a string may have (none: any).
	Enum []string
}

// errorRow is a row of the error table in info.description:
// | 404 | not_found | when |.
var errorRow = regexp.MustCompile(`(?m)^\|\s*(\d{3})\s*\|\s*([a-z_]+)\s*\|`)

// ErrorCodes returns the codes of the document's error answers: the enum
// of ErrorDetail's code.
func (d *Doc) ErrorCodes() ([]string, error) {
	s, err := d.Component("ErrorDetail")
	if err != nil {
		return nil, err
	}
	enum := s.Properties["code"].Enum
	if len(enum) == 0 {
		return nil, fmt.Errorf("ErrorDetail.code has no enum")
	}
	return enum, nil
}

// ErrorStatuses returns the table of error codes in the document's
// description: code → HTTP status.
func (d *Doc) ErrorStatuses() map[string]int {
	info, _ := d.root["info"].(map[string]any)
	desc, _ := info["description"].(string)
	out := map[string]int{}
	for _, m := range errorRow.FindAllStringSubmatch(desc, -1) {
		st, _ := strconv.Atoi(m[1])
		out[m[2]] = st
	}
	return out
}

// Component returns #/components/schemas/NAME.
func (d *Doc) Component(name string) (*Schema, error) {
	return d.At("#/components/schemas/" + name)
}

// At returns the schema at a JSON pointer into the document.
func (d *Doc) At(ptr string) (*Schema, error) {
	n, err := d.pointer(ptr)
	if err != nil {
		return nil, err
	}
	return d.resolve(n, 0)
}

// Request returns the JSON request body's schema of op ("POST /v1/sandboxes").
func (d *Doc) Request(op string) (*Schema, error) {
	o, err := d.operation(op)
	if err != nil {
		return nil, err
	}
	body, _ := o["requestBody"].(map[string]any)
	return d.content(op+" request body", body)
}

// Answer returns the schema of op's answer with status ("200"): its
// application/json or, for a stream, application/x-ndjson content (the
// schema of one line).
func (d *Doc) Answer(op, status string) (*Schema, error) {
	o, err := d.operation(op)
	if err != nil {
		return nil, err
	}
	res, _ := o["responses"].(map[string]any)
	r, ok := res[status].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s has no answer %s", op, status)
	}
	if ref, ok := r["$ref"].(string); ok {
		n, err := d.pointer(ref)
		if err != nil {
			return nil, err
		}
		r, _ = n.(map[string]any)
	}
	return d.content(op+" answer "+status, r)
}

func (d *Doc) operation(op string) (map[string]any, error) {
	method, path, ok := strings.Cut(op, " ")
	if !ok {
		return nil, fmt.Errorf("operation %q: want METHOD /path", op)
	}
	paths := d.root["paths"].(map[string]any)
	item, ok := paths[path].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("api/openapi.yaml has no path %s", path)
	}
	o, ok := item[strings.ToLower(method)].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("api/openapi.yaml has no operation %s", op)
	}
	return o, nil
}

// content returns the JSON (or NDJSON) schema of a request body or answer.
func (d *Doc) content(what string, n map[string]any) (*Schema, error) {
	c, _ := n["content"].(map[string]any)
	for _, mt := range []string{"application/json", "application/x-ndjson"} {
		if m, ok := c[mt].(map[string]any); ok {
			return d.resolve(m["schema"], 0)
		}
	}
	return nil, fmt.Errorf("%s has no application/json or application/x-ndjson content", what)
}

// pointer follows a local JSON pointer ("#/components/schemas/Sandbox").
func (d *Doc) pointer(ptr string) (any, error) {
	rest, ok := strings.CutPrefix(ptr, "#/")
	if !ok {
		return nil, fmt.Errorf("$ref %q: only local references (#/...) are supported", ptr)
	}
	var n any = d.root
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := n.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %q: %q is not an object", ptr, tok)
		}
		if n, ok = m[tok]; !ok {
			return nil, fmt.Errorf("$ref %q names nothing", ptr)
		}
	}
	return n, nil
}

// maxDepth bounds nesting, against a schema that refers to itself.
const maxDepth = 32

func (d *Doc) resolve(n any, depth int) (*Schema, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("schemas nest deeper than %d (a $ref cycle?)", maxDepth)
	}
	m, ok := n.(map[string]any)
	if !ok {
		if n == nil {
			return &Schema{}, nil // no schema: any value
		}
		return nil, fmt.Errorf("a schema is a %T, not an object", n)
	}
	if ref, ok := m["$ref"].(string); ok {
		// Siblings of $ref (a description) are ignored, as OpenAPI 3.0 says.
		t, err := d.pointer(ref)
		if err != nil {
			return nil, err
		}
		s, err := d.resolve(t, depth+1)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		return s, nil
	}
	s := &Schema{}
	s.Type, _ = m["type"].(string)
	s.Format, _ = m["format"].(string)
	s.Nullable, _ = m["nullable"].(bool)
	if enum, ok := m["enum"].([]any); ok {
		for _, e := range enum {
			if v, ok := e.(string); ok {
				s.Enum = append(s.Enum, v)
			}
		}
	}
	if _, ok := m["oneOf"]; ok {
		s.OneOf = true
		return s, nil
	}
	if _, ok := m["anyOf"]; ok {
		s.OneOf = true
		return s, nil
	}
	if parts, ok := m["allOf"].([]any); ok {
		for _, p := range parts {
			ps, err := d.resolve(p, depth+1)
			if err != nil {
				return nil, err
			}
			if err := s.merge(ps); err != nil {
				return nil, err
			}
		}
	}
	if props, ok := m["properties"].(map[string]any); ok {
		if s.Properties == nil {
			s.Properties = map[string]*Schema{}
		}
		for name, p := range props {
			ps, err := d.resolve(p, depth+1)
			if err != nil {
				return nil, fmt.Errorf("property %s: %w", name, err)
			}
			s.Properties[name] = ps
		}
	}
	if req, ok := m["required"].([]any); ok {
		if s.Required == nil {
			s.Required = map[string]bool{}
		}
		for _, r := range req {
			if name, ok := r.(string); ok {
				s.Required[name] = true
			}
		}
	}
	if items, ok := m["items"]; ok {
		is, err := d.resolve(items, depth+1)
		if err != nil {
			return nil, fmt.Errorf("items: %w", err)
		}
		s.Items = is
	}
	if ap, ok := m["additionalProperties"].(map[string]any); ok {
		vs, err := d.resolve(ap, depth+1)
		if err != nil {
			return nil, fmt.Errorf("additionalProperties: %w", err)
		}
		s.Values = vs
	}
	if s.Type == "" && s.Properties != nil {
		s.Type = "object"
	}
	return s, nil
}

// merge adds the part p of an allOf to s.
func (s *Schema) merge(p *Schema) error {
	if p.Type != "" && p.Type != "object" {
		return fmt.Errorf("allOf of a %s: only objects are supported", p.Type)
	}
	if len(p.Properties) == 0 {
		// A part that only describes (allOf: [{$ref}] with a description)
		// gives its whole self.
		if s.Type == "" && s.Properties == nil {
			*s = *p
			return nil
		}
	}
	s.Type = "object"
	if s.Properties == nil {
		s.Properties = map[string]*Schema{}
	}
	if s.Required == nil {
		s.Required = map[string]bool{}
	}
	for k, v := range p.Properties {
		s.Properties[k] = v
	}
	for k := range p.Required {
		s.Required[k] = true
	}
	return nil
}

// Options adjust Match.
type Options struct {
	// Sent says that the Go type is what the server sends: a property the
	// schema requires must then not be left out when empty (omitempty or
	// omitzero on a field whose empty value encoding/json would drop).
	Sent bool
	// Ignore names properties not to compare, each with the reason (a
	// field written by hand after the struct, say). A name is a dotted
	// path from the type: "stdout", "memory.lazy", "versions.digest" (an
	// array's items have no step of their own).
	Ignore map[string]string
}

// Match compares the JSON form of Go type t with schema s, both ways:
// a property of the schema that t lacks, a field of t the schema lacks,
// and values of another type (a string for an integer, ...), at every
// level. It returns the differences, one sentence each, sorted; none when
// they agree. Types with their own JSON encoding (a json.Marshaler other
// than time.Time) and oneOf schemas are compared no further.
func Match(t reflect.Type, s *Schema, opts Options) []string {
	m := matcher{opts: opts, used: map[string]bool{}}
	m.match("", t, s)
	for k := range opts.Ignore {
		if !m.used[k] {
			m.diffs = append(m.diffs, fmt.Sprintf("%s: ignored, but neither the Go type nor the schema has it (remove it from the ignore list)", k))
		}
	}
	sort.Strings(m.diffs)
	return m.diffs
}

type matcher struct {
	opts  Options
	used  map[string]bool
	diffs []string
}

func (m *matcher) errorf(path, format string, args ...any) {
	if path == "" {
		path = "(the value)"
	}
	m.diffs = append(m.diffs, path+": "+fmt.Sprintf(format, args...))
}

var (
	timeType      = reflect.TypeFor[time.Time]()
	marshalerType = reflect.TypeFor[json.Marshaler]()
	unmarshalType = reflect.TypeFor[json.Unmarshaler]()
)

// custom reports whether t encodes itself (other than time.Time).
func custom(t reflect.Type) bool {
	if t == timeType {
		return false
	}
	pt := reflect.PointerTo(t)
	return t.Implements(marshalerType) || pt.Implements(marshalerType) ||
		t.Implements(unmarshalType) || pt.Implements(unmarshalType)
}

func (m *matcher) match(path string, t reflect.Type, s *Schema) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s.OneOf || custom(t) || t.Kind() == reflect.Interface {
		return
	}
	if s.Type == "" {
		return // any value
	}
	switch {
	case t == timeType:
		if s.Type != "string" || s.Format != "date-time" {
			m.errorf(path, "Go has a time, the schema %s", describe(s))
		}
		return
	case s.Type == "string" && s.Format == "date-time" && t.Kind() == reflect.String:
		m.errorf(path, "the schema has a date-time, Go a plain %s", t)
		return
	}
	switch t.Kind() {
	case reflect.String:
		m.want(path, t, s, "string")
	case reflect.Bool:
		m.want(path, t, s, "boolean")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		m.want(path, t, s, "integer")
	case reflect.Float32, reflect.Float64:
		m.want(path, t, s, "number")
	case reflect.Slice, reflect.Array:
		if m.want(path, t, s, "array") && s.Items != nil {
			m.match(path, t.Elem(), s.Items)
		}
	case reflect.Map:
		if !m.want(path, t, s, "object") {
			return
		}
		if len(s.Properties) > 0 {
			m.errorf(path, "Go has a map (%s), the schema an object with properties %s", t, names(s.Properties))
			return
		}
		if s.Values != nil {
			m.match(path, t.Elem(), s.Values)
		}
	case reflect.Struct:
		if !m.want(path, t, s, "object") {
			return
		}
		if s.Properties == nil && s.Values == nil {
			return // a free-form object
		}
		m.object(path, t, s)
	default:
		m.errorf(path, "Go has a %s, which has no JSON form", t)
	}
}

// want reports whether s is of JSON type typ, and says so if not.
func (m *matcher) want(path string, t reflect.Type, s *Schema, typ string) bool {
	if s.Type != typ {
		m.errorf(path, "Go has %s (a JSON %s), the schema %s", t, typ, describe(s))
		return false
	}
	return true
}

func describe(s *Schema) string {
	if s.Format != "" {
		return "a " + s.Type + " (" + s.Format + ")"
	}
	return "a " + s.Type
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (m *matcher) object(path string, t reflect.Type, s *Schema) {
	fields := jsonFields(t)
	for name, f := range fields {
		p := join(path, name)
		if _, ok := m.opts.Ignore[p]; ok {
			m.used[p] = true
			continue
		}
		ps, ok := s.Properties[name]
		if !ok {
			m.errorf(p, "Go has the field %s, the schema has no such property", f.goName)
			continue
		}
		if m.opts.Sent && s.Required[name] && f.omitted() {
			m.errorf(p, "the schema requires it, but Go's field %s is %s: the server leaves it out when it is empty", f.goName, f.omitTag)
		}
		m.match(p, f.typ, ps)
	}
	for name := range s.Properties {
		p := join(path, name)
		if _, ok := m.opts.Ignore[p]; ok {
			m.used[p] = true
			continue
		}
		if _, ok := fields[name]; !ok {
			m.errorf(p, "the schema has this property, Go's %s has no field for it", t)
		}
	}
}

func names(props map[string]*Schema) string {
	out := make([]string, 0, len(props))
	for k := range props {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// field is a JSON field of a struct.
type field struct {
	goName  string
	typ     reflect.Type
	omitTag string // "omitempty", "omitzero" or ""
}

// omitted reports whether encoding/json may leave the field out.
func (f field) omitted() bool {
	switch f.omitTag {
	case "omitzero":
		return true
	case "omitempty":
		t := f.typ
		// omitempty never drops a struct (a time.Time included).
		return t.Kind() != reflect.Struct
	}
	return false
}

// jsonFields lists t's fields as encoding/json encodes them: by JSON name,
// embedded structs without a name of their own promoted, "-" left out.
func jsonFields(t reflect.Type) map[string]field {
	out := map[string]field{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					if _, dup := out[k]; !dup {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		var omit string
		for o := range strings.SplitSeq(opts, ",") {
			if o == "omitempty" || o == "omitzero" {
				omit = o
			}
		}
		out[name] = field{goName: f.Name, typ: ft, omitTag: omit}
	}
	return out
}
