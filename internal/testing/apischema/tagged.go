package apischema

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
)

// Unheld checks that a package holds all its wire types to the document:
// every named struct type with a JSON tag declared in dir's non-test Go
// files must be one of roots or reachable from them (through fields,
// pointers, slices and maps, counting types of package pkgPath), or be
// listed in notWire (a name and why it is no REST body). It returns the
// tagged types that are neither (unheld) and the names notWire lists that
// are no tagged struct there (stale).
func Unheld(dir, pkgPath string, roots []reflect.Type, notWire map[string]string) (unheld, stale []string, err error) {
	checked := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || checked[t.Name()] {
			return
		}
		if t.PkgPath() == pkgPath {
			checked[t.Name()] = true
		}
		for i := range t.NumField() {
			walk(t.Field(i).Type)
		}
	}
	for _, t := range roots {
		walk(t)
	}
	tagged, err := taggedStructs(dir)
	if err != nil {
		return nil, nil, err
	}
	for name := range notWire {
		if !slices.Contains(tagged, name) {
			stale = append(stale, name)
		}
	}
	sort.Strings(stale)
	for _, name := range tagged {
		if !checked[name] && notWire[name] == "" {
			unheld = append(unheld, name)
		}
	}
	return unheld, stale, nil
}

// taggedStructs lists the named struct types declared in dir's non-test
// Go files that have a field with a json tag, sorted.
func taggedStructs(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		af, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		ast.Inspect(af, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fld := range st.Fields.List {
				if fld.Tag != nil && strings.Contains(fld.Tag.Value, `json:"`) {
					out = append(out, ts.Name.Name)
					break
				}
			}
			return true
		})
	}
	sort.Strings(out)
	return out, nil
}
