package objstore

import (
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// ParseError is a store URL that cannot be used; its text names the flag
// the URL came from, which is what a user typed.
type ParseError struct {
	URL string // as given, without credentials
	Msg string
}

func (e *ParseError) Error() string { return "--store " + e.URL + ": " + e.Msg }

// Open opens the store a URL names:
//
//	/var/lib/pandastack/store            a local directory (a plain path)
//	file:///var/lib/pandastack/store     the same
//	s3://bucket[/prefix][?endpoint=host:port&insecure=1&region=r&retries=n]
//
// For s3://, endpoint is the server's address ("" for AWS S3), insecure=1
// speaks plain HTTP, region defaults to us-east-1, retries is how many
// times a failing request is tried (see S3Config). creds sign S3 requests
// (EnvCredentials reads the standard AWS variables); a local directory
// ignores them. Open makes a directory that does not exist; it sends no
// request to S3.
func Open(raw string, creds Credentials) (Store, error) {
	scheme, _, _ := strings.Cut(raw, "://")
	switch {
	case raw == "":
		return nil, &ParseError{URL: `""`, Msg: "empty: want a directory, file:///dir or s3://bucket/prefix?endpoint=host:port"}
	case !strings.Contains(raw, "://"):
		return OpenDir(raw)
	case scheme == "file":
		u, err := url.Parse(raw)
		if err != nil {
			return nil, &ParseError{URL: raw, Msg: err.Error()}
		}
		if u.Host != "" && u.Host != "localhost" {
			return nil, &ParseError{URL: raw, Msg: fmt.Sprintf("file URL with host %q: want file:///absolute/path", u.Host)}
		}
		if u.Path == "" || u.RawQuery != "" {
			return nil, &ParseError{URL: raw, Msg: "want file:///absolute/path and no query"}
		}
		return OpenDir(u.Path)
	case scheme == "s3":
		cfg, err := ParseS3(raw)
		if err != nil {
			return nil, err
		}
		cfg.Credentials = creds
		s, err := OpenS3(cfg)
		if err != nil {
			return nil, &ParseError{URL: redact(raw), Msg: err.Error()}
		}
		return s, nil
	default:
		return nil, &ParseError{URL: redact(raw), Msg: fmt.Sprintf("unknown scheme %q: want a directory, file:///dir or s3://bucket/prefix", scheme)}
	}
}

// bucketName is S3's rule for new buckets.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// ParseS3 parses an s3:// URL (see Open) into a config without
// credentials.
func ParseS3(raw string) (S3Config, error) {
	bad := func(format string, args ...any) (S3Config, error) {
		return S3Config{}, &ParseError{URL: redact(raw), Msg: fmt.Sprintf(format, args...)}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("%v", err)
	}
	if u.Scheme != "s3" {
		return bad("scheme %q: want s3", u.Scheme)
	}
	if u.User != nil {
		return bad("credentials in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead")
	}
	cfg := S3Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	if cfg.Bucket == "" {
		return bad("no bucket: want s3://bucket/prefix")
	}
	if !bucketName.MatchString(cfg.Bucket) || strings.Contains(cfg.Bucket, "..") {
		return bad("bucket %q: want 3-63 lowercase letters, digits, dots and dashes", cfg.Bucket)
	}
	if cfg.Prefix != "" {
		if err := validPath(cfg.Prefix); err != nil {
			return bad("prefix %q: %s", cfg.Prefix, err)
		}
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("query: %v", err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return bad("%s given %d times", k, len(vs))
		}
		v := vs[0]
		switch k {
		case "endpoint":
			if v == "" || strings.Contains(v, "/") {
				return bad("endpoint %q: want host:port (no scheme; insecure=1 for plain HTTP)", v)
			}
			cfg.Endpoint = v
		case "insecure":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return bad("insecure %q: want 1 or 0", v)
			}
			cfg.Insecure = b
		case "region":
			if v == "" {
				return bad("empty region")
			}
			cfg.Region = v
		case "retries":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 100 {
				return bad("retries %q: want 1 to 100", v)
			}
			cfg.Retries = n
		default:
			return bad("unknown parameter %q: want endpoint, insecure, region or retries", k)
		}
	}
	return cfg, nil
}

// redact hides a password someone put in a URL.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	return raw
}
