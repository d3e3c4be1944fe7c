package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

// runCmd is `panda run`: a cell of code in a sandbox's code interpreter.
func runCmd(g *globals) *cobra.Command {
	var (
		code, language, contextID, timeout, imagesDir string
	)
	cmd := &cobra.Command{
		Use:   "run ID [-c CODE | FILE | -]",
		Short: "Run code in a sandbox's code interpreter (Python, JavaScript, bash)",
		Long: `Run a cell of code in the code interpreter of a sandbox made from the
code-interpreter template (panda create --template code-interpreter). The
code is -c CODE, a FILE, or - for standard input.

The cell runs in a context that keeps its state from run to run: the
default context of --language (python by default; a FILE ending in .js or
.sh picks javascript or bash), or --context ID (panda's API and SDKs make
contexts). Its output is printed as it comes; each value it displays is
printed as text, and images (PNG, JPEG, SVG) are saved as cell-N-K.EXT in
--images-dir, N the cell's execution count and K the image's number in
the cell, and their paths printed. An exception is printed to stderr with
its traceback and panda exits with status 1.

With --json the whole execution is printed at the end as JSON: results
(each a MIME type → value map, as the API sends them), stdout, stderr,
error, execution_count, context_id, truncated.`,
		Example: `  panda run $ID -c 'import sys; print(sys.version)'
  panda run $ID analysis.py
  echo 'ls -la' | panda run $ID --language bash -
  panda run $ID --images-dir plots -c 'import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()'`,
		Args: args(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, lang, err := runSource(cmd, args, code, language)
			if err != nil {
				return err
			}
			if contextID != "" {
				lang = language // a context has its language: infer none
			}
			d, err := parseTimeout(timeout)
			if err != nil {
				return err
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			opts := pandastack.RunCodeOptions{Language: lang, ContextID: contextID, Timeout: d}
			var results []pandastack.Result
			if !g.json {
				opts.OnStdout = func(s string) { io.WriteString(stdout, s) }
				opts.OnStderr = func(s string) { io.WriteString(stderr, s) }
				// Texts are printed as they come; images are saved at the
				// end, when the cell's execution count (their name) is known.
				opts.OnResult = func(r pandastack.Result) {
					results = append(results, r)
					if len(imagesOf(r)) == 0 {
						printResult(stdout, r)
					}
				}
			}
			ctx := cmd.Context()
			ex, err := sb.RunCode(ctx, src, opts)
			if err != nil {
				if errors.Is(err, context.Canceled) && ctx.Err() != nil {
					return ExitError{Code: 130} // interrupted: so was the cell
				}
				return fmt.Errorf("run in %s: %w", args[0], err)
			}
			if g.json {
				if err := printJSON(stdout, executionJSON(ex)); err != nil {
					return err
				}
			} else {
				paths, err := saveImages(imagesDir, ex.ExecutionCount, results)
				for _, p := range paths {
					fmt.Fprintln(stdout, p)
				}
				if err != nil {
					return err
				}
				if ex.Error != nil {
					printTraceback(stderr, ex.Error)
				}
			}
			if ex.Error != nil {
				return ExitError{Code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&code, "code", "c", "", "the code to run (instead of FILE)")
	f.StringVarP(&language, "language", "l", "", "python (default), javascript or bash: run in that language's default context")
	f.StringVar(&contextID, "context", "", "run in this context (its language is its own)")
	f.StringVar(&timeout, "timeout", "", "interrupt the cell after this long: seconds or a duration like 90s, 10m (default the server's, 5m; at most 1h)")
	f.StringVar(&imagesDir, "images-dir", ".", "where to save the images the cell displays")
	return cmd
}

// runSource returns the code to run and its language: -c's, FILE's (the
// language from its extension, unless --language says), or standard
// input's (-).
func runSource(cmd *cobra.Command, args []string, code, language string) (string, string, error) {
	hasC := cmd.Flags().Changed("code")
	switch {
	case hasC && len(args) == 2:
		return "", "", fmt.Errorf("give the code with -c or as FILE, not both\nusage: %s", cmd.UseLine())
	case hasC:
		return code, language, nil
	case len(args) == 1:
		return "", "", fmt.Errorf("no code: give -c CODE, a FILE, or - for standard input\nusage: %s", cmd.UseLine())
	case args[1] == "-":
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return "", "", fmt.Errorf("read standard input: %w", err)
		}
		return string(b), language, nil
	}
	b, err := os.ReadFile(args[1])
	if err != nil {
		return "", "", fmt.Errorf("read the code: %w", err)
	}
	if language == "" {
		switch strings.ToLower(filepath.Ext(args[1])) {
		case ".js", ".mjs", ".cjs":
			language = "javascript"
		case ".sh", ".bash":
			language = "bash"
		}
	}
	return string(b), language, nil
}

// parseTimeout reads --timeout: whole seconds or a Go duration ("": the
// server's default).
func parseTimeout(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		n, nerr := strconv.ParseFloat(s, 64)
		if nerr != nil {
			return 0, fmt.Errorf("--timeout %q: want seconds or a duration like 90s or 10m", s)
		}
		d = seconds(n)
	}
	if d < time.Second || d > time.Hour {
		return 0, fmt.Errorf("--timeout %s: want 1s to 1h", s)
	}
	return d, nil
}

// image is one image of a result: its extension and bytes.
type image struct {
	ext  string
	data []byte
}

// imagesOf are the images of r worth a file (the PNG of a figure, not also
// its SVG, when both came).
func imagesOf(r pandastack.Result) []image {
	switch {
	case len(r.PNG) > 0:
		return []image{{"png", r.PNG}}
	case len(r.JPEG) > 0:
		return []image{{"jpeg", r.JPEG}}
	case r.SVG != "":
		return []image{{"svg", []byte(r.SVG)}}
	}
	return nil
}

// printResult prints a result without an image: its text, else which
// formats it came in.
func printResult(w io.Writer, r pandastack.Result) {
	switch {
	case r.Text != "":
		fmt.Fprintln(w, strings.TrimSuffix(r.Text, "\n"))
	case r.Markdown != "":
		fmt.Fprintln(w, strings.TrimSuffix(r.Markdown, "\n"))
	case len(r.JSON) > 0:
		fmt.Fprintln(w, string(r.JSON))
	case len(r.Data) > 0:
		fmt.Fprintf(w, "[a result in %s]\n", strings.Join(r.Formats(), ", "))
	}
}

// saveImages writes the images of results as cell-N-K.EXT in dir (K
// counts the cell's images from 1) and returns their paths.
func saveImages(dir string, n int, results []pandastack.Result) ([]string, error) {
	var paths []string
	k := 0
	for _, r := range results {
		for _, img := range imagesOf(r) {
			if k == 0 {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return paths, fmt.Errorf("save images: %w", err)
				}
			}
			k++
			p := filepath.Join(dir, fmt.Sprintf("cell-%d-%d.%s", n, k, img.ext))
			if err := os.WriteFile(p, img.data, 0o644); err != nil {
				return paths, fmt.Errorf("save image: %w", err)
			}
			paths = append(paths, p)
		}
	}
	return paths, nil
}

// printTraceback prints a cell's exception: its traceback, which ends
// with the exception's name and message, or those alone.
func printTraceback(w io.Writer, e *pandastack.ExecutionError) {
	tb := strings.TrimRight(e.Traceback, "\n")
	if tb == "" {
		fmt.Fprintln(w, e.Error())
		return
	}
	fmt.Fprintln(w, tb)
	if !strings.Contains(tb, e.Name) {
		fmt.Fprintln(w, e.Error())
	}
}

// executionJSON is an execution as --json prints it.
func executionJSON(ex *pandastack.Execution) any {
	type errJSON struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	}
	type resultJSON struct {
		IsMainResult bool                       `json:"is_main_result"`
		Data         map[string]json.RawMessage `json:"data"`
		Chart        json.RawMessage            `json:"chart,omitempty"`
	}
	out := struct {
		Results        []resultJSON `json:"results"`
		Stdout         string       `json:"stdout"`
		Stderr         string       `json:"stderr"`
		Error          *errJSON     `json:"error"`
		ExecutionCount int          `json:"execution_count"`
		ContextID      string       `json:"context_id"`
		DurationMS     int64        `json:"duration_ms"`
		Truncated      bool         `json:"truncated"`
	}{Results: []resultJSON{}, Stdout: strings.Join(ex.Logs.Stdout, ""), Stderr: strings.Join(ex.Logs.Stderr, ""),
		ExecutionCount: ex.ExecutionCount, ContextID: ex.ContextID, DurationMS: ex.Duration.Milliseconds(), Truncated: ex.Truncated}
	for _, r := range ex.Results {
		out.Results = append(out.Results, resultJSON{IsMainResult: r.IsMainResult, Data: r.Data, Chart: r.Chart})
	}
	if e := ex.Error; e != nil {
		out.Error = &errJSON{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
	}
	return out
}
