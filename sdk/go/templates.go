package pandastack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Template states.
const (
	TemplateReady    = "ready"
	TemplateStale    = "stale"
	TemplateNotBaked = "not_baked"
	TemplateBaking   = "baking"
)

// Template is a root filesystem sandboxes start from, in one baked shape
// (memory size and vCPUs).
type Template struct {
	Name        string    `json:"name"`
	MemoryMiB   int       `json:"memory_mib,omitempty"`
	VCPUs       int       `json:"vcpus,omitempty"`
	State       string    `json:"state"` // ready, stale, not_baked, baking
	StaleReason string    `json:"stale_reason,omitempty"`
	BakedAt     time.Time `json:"baked_at,omitzero"`
	BakeMS      int64     `json:"bake_ms,omitempty"`
}

// Templates lists the templates, one entry per baked shape.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out struct {
		Templates []Template `json:"templates"`
	}
	if err := c.doJSON(ctx, http.MethodGet, path("templates"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// BakeTemplate bakes (or re-bakes) the template name for a shape (0 for
// the server's defaults) and returns it ready. progress, if not nil, is
// called with each progress message. Admin keys only.
func (c *Client) BakeTemplate(ctx context.Context, name string, memoryMiB, vcpus int, progress func(string)) (Template, error) {
	if name == "" {
		return Template{}, newError(0, CodeInvalid, "template name is empty")
	}
	in := struct {
		MemoryMiB int `json:"memory_mib,omitempty"`
		VCPUs     int `json:"vcpus,omitempty"`
	}{memoryMiB, vcpus}
	b, err := json.Marshal(in)
	if err != nil {
		return Template{}, fmt.Errorf("encode request: %w", err)
	}
	req, err := c.newRequest(ctx, http.MethodPost, path("templates", name, "bake"), nil, bytesReader(b), "application/json")
	if err != nil {
		return Template{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return Template{}, err
	}
	defer resp.Body.Close()
	return readBakeStream(resp.Body, progress)
}

type bakeEvent struct {
	Type     string    `json:"type"`
	Message  string    `json:"message"`
	Template *Template `json:"template"`
	Error    *Error    `json:"error"`
}

func readBakeStream(r io.Reader, progress func(string)) (Template, error) {
	dec := json.NewDecoder(r)
	for {
		var ev bakeEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return Template{}, fmt.Errorf("bake: %w before the template was baked", ErrStreamEnded)
			}
			return Template{}, fmt.Errorf("bake: read progress stream: %w", err)
		}
		switch ev.Type {
		case "progress":
			if progress != nil {
				progress(ev.Message)
			}
		case "done":
			if ev.Template == nil {
				return Template{}, newError(0, CodeInternal, "bake: done event without a template")
			}
			return *ev.Template, nil
		case "error":
			if ev.Error == nil {
				return Template{}, newError(0, CodeInternal, "bake: error event without an error")
			}
			return Template{}, newError(0, ev.Error.Code, ev.Error.Message)
		}
	}
}
