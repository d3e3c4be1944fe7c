package dockerfile

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// supportedList is how errors name the instructions this builder runs.
const supportedList = "FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, CMD, ENTRYPOINT, LABEL, EXPOSE"

// instr is one instruction as parsed, before expansion.
type instr struct {
	line int
	// cmd is the instruction, upper case ("RUN").
	cmd string
	// text is the instruction as written, continuation lines joined.
	text string
	// args are its arguments: for RUN, CMD and ENTRYPOINT in shell form the
	// one command string; for ENV and LABEL key, value pairs; for ARG the
	// words ("name" or "name=default").
	args  []string
	json  bool
	flags []string
}

// file is a parsed Dockerfile: one stage.
type file struct {
	escape rune
	// globalArgs are the ARGs before FROM.
	globalArgs []instr
	from       instr
	// steps are the instructions after FROM.
	steps []instr
}

// userError is an error whose message is written for users; it is of the
// class class.
type userError struct {
	msg   string
	class error
}

func (e *userError) Error() string        { return e.msg }
func (e *userError) Is(target error) bool { return target == e.class }

func invalidf(format string, args ...any) error {
	return &userError{msg: fmt.Sprintf(format, args...), class: ErrInvalid}
}

func lineErr(line int, format string, args ...any) error {
	return invalidf("Dockerfile line %d: %s", line, fmt.Sprintf(format, args...))
}

// parse parses a Dockerfile and checks that it uses only what this builder
// supports. Errors wrap ErrInvalid.
func parse(data []byte) (*file, error) {
	if len(data) > MaxDockerfileBytes {
		return nil, invalidf("the Dockerfile is larger than %d bytes", MaxDockerfileBytes)
	}
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		var le *parser.LocationError
		if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
			return nil, lineErr(le.Locations[0][0].Start.Line, "%s", cleanParserError(err))
		}
		return nil, invalidf("Dockerfile: %s", cleanParserError(err))
	}
	f := &file{escape: res.EscapeToken}
	if len(res.AST.Children) > MaxSteps {
		return nil, invalidf("the Dockerfile has %d instructions; at most %d are allowed", len(res.AST.Children), MaxSteps)
	}
	seenFrom := false
	for _, n := range res.AST.Children {
		in, err := instrOf(n)
		if err != nil {
			return nil, err
		}
		switch {
		case in.cmd == "FROM" && seenFrom:
			return nil, lineErr(in.line, "a second FROM: multi-stage builds are not supported (one FROM per Dockerfile)")
		case in.cmd == "FROM":
			if err := checkFrom(in); err != nil {
				return nil, err
			}
			seenFrom = true
			f.from = in
		case !seenFrom && in.cmd == "ARG":
			f.globalArgs = append(f.globalArgs, in)
		case !seenFrom:
			return nil, lineErr(in.line, "%s before FROM: only ARG may come before FROM", in.cmd)
		default:
			f.steps = append(f.steps, in)
		}
	}
	if !seenFrom {
		return nil, invalidf("the Dockerfile has no FROM instruction")
	}
	return f, nil
}

// cleanParserError is the parser's message without its stack wrapping.
func cleanParserError(err error) string {
	msg := err.Error()
	if len(msg) > 500 {
		msg = msg[:500] + "…"
	}
	return msg
}

// instrOf turns a parser node into an instr, refusing what is not supported.
func instrOf(n *parser.Node) (instr, error) {
	in := instr{
		line: n.StartLine,
		cmd:  strings.ToUpper(n.Value),
		text: strings.TrimSpace(n.Original),
		json: n.Attributes["json"],
	}
	for x := n.Next; x != nil; x = x.Next {
		in.args = append(in.args, x.Value)
	}
	in.flags = n.Flags
	if len(n.Heredocs) > 0 {
		return in, lineErr(in.line, "heredocs (<<) in %s are not supported", in.cmd)
	}
	allowed := map[string][]string{
		"FROM": nil, "RUN": nil, "ENV": nil, "ARG": nil, "WORKDIR": nil, "USER": nil,
		"CMD": nil, "ENTRYPOINT": nil, "LABEL": nil, "EXPOSE": nil, "MAINTAINER": nil,
		"COPY": {"chown", "chmod", "link"},
		"ADD":  {"chown", "chmod", "link"},
	}
	flags, ok := allowed[in.cmd]
	if !ok {
		switch in.cmd {
		case "ONBUILD", "HEALTHCHECK", "VOLUME", "SHELL", "STOPSIGNAL":
			return in, lineErr(in.line, "%s is not supported (supported: %s)", in.cmd, supportedList)
		}
		return in, lineErr(in.line, "unknown instruction %s (supported: %s)", cut(in.cmd, 40), supportedList)
	}
	for _, fl := range in.flags {
		name, _, _ := strings.Cut(strings.TrimPrefix(fl, "--"), "=")
		ok := false
		for _, a := range flags {
			ok = ok || a == name
		}
		if !ok {
			return in, lineErr(in.line, "%s %s is not supported", in.cmd, flagName(in.cmd, fl))
		}
	}
	switch in.cmd {
	case "RUN", "WORKDIR", "USER", "COPY", "ADD", "ENV", "ARG":
		if len(in.args) == 0 || (len(in.args) == 1 && strings.TrimSpace(in.args[0]) == "") {
			return in, lineErr(in.line, "%s needs arguments", in.cmd)
		}
	}
	switch in.cmd {
	case "COPY", "ADD":
		if len(in.args) < 2 {
			return in, lineErr(in.line, "%s needs a source and a destination", in.cmd)
		}
	case "ENV", "LABEL":
		// The parser gives key, value, separator triples.
		var kv []string
		for i := 0; i+1 < len(in.args); i += 3 {
			kv = append(kv, in.args[i], in.args[i+1])
		}
		in.args = kv
	}
	return in, nil
}

func flagName(cmd, fl string) string {
	name, _, _ := strings.Cut(fl, "=")
	if cmd == "RUN" && name == "--mount" {
		return "--mount (cache, secret and bind mounts)"
	}
	if name == "--from" {
		return "--from (multi-stage builds)"
	}
	return cut(name, 40)
}

func checkFrom(in instr) error {
	if len(in.args) == 0 {
		return lineErr(in.line, "FROM needs an image")
	}
	if len(in.args) != 1 && !(len(in.args) == 3 && strings.EqualFold(in.args[1], "AS")) {
		return lineErr(in.line, "FROM takes an image and optionally AS name")
	}
	return nil
}

// cut shortens s to at most n bytes for a message.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
