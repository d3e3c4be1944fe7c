package hostwire

import (
	"fmt"
	"os"
	"strings"
)

// ReadToken reads an agent token from path (surrounding white space is
// ignored): the file the agent writes on first start, and the control
// plane reads to talk to it.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read agent token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("read agent token: %s is empty", path)
	}
	return tok, nil
}
