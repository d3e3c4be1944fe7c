package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is a Store in a bucket of an S3-compatible server: the object with
// key "a/b" is <prefix>/a/b in the bucket. S3 gives every guarantee the
// contract asks for (atomic, durable puts; strongly consistent reads and
// listings after a write).
type S3 struct {
	client *minio.Client
	core   minio.Core
	bucket string
	prefix string // "" or "p/" (with the slash)
	name   string // for String: s3://bucket/prefix?endpoint=…
}

var _ Store = (*S3)(nil)

// S3Config says where a bucket is and how to reach it. OpenS3 reads no
// environment: cmd/ fills the credentials (EnvCredentials).
type S3Config struct {
	Bucket   string
	Prefix   string // key prefix inside the bucket, without slashes at its ends; may be ""
	Endpoint string // host:port; "" for AWS S3
	Insecure bool   // plain HTTP instead of HTTPS
	Region   string // "" for us-east-1
	// Retries is how many times a request that failed with a network
	// error or a 5xx is tried in all (with backoff, 0.2 s to 1 s apart)
	// before it fails as ErrUnavailable; 0 means 10.
	Retries int
	Credentials
}

// Credentials sign requests to S3.
type Credentials struct {
	AccessKey, SecretKey, SessionToken string
}

// EnvCredentials reads the standard variables AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN through getenv (os.Getenv
// in cmd/).
func EnvCredentials(getenv func(string) string) Credentials {
	return Credentials{
		AccessKey:    getenv("AWS_ACCESS_KEY_ID"),
		SecretKey:    getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken: getenv("AWS_SESSION_TOKEN"),
	}
}

// OpenS3 makes a client for the bucket. It sends no request: a bucket
// that is missing or a server that is down shows on first use.
func OpenS3(cfg S3Config) (*S3, error) {
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, errors.New("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	endpoint := cfg.Endpoint
	lookup := minio.BucketLookupPath // an own server rarely has wildcard DNS for buckets
	if endpoint == "" {
		endpoint, lookup = "s3.amazonaws.com", minio.BucketLookupAuto
	}
	region := cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	client, err := minio.New(endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken),
		Secure:       !cfg.Insecure,
		Region:       region,
		BucketLookup: lookup,
		MaxRetries:   cfg.Retries,
	})
	if err != nil {
		return nil, err
	}
	s := &S3{client: client, core: minio.Core{Client: client}, bucket: cfg.Bucket}
	s.name = "s3://" + cfg.Bucket
	if cfg.Prefix != "" {
		s.prefix = cfg.Prefix + "/"
		s.name += "/" + cfg.Prefix
	}
	if cfg.Endpoint != "" {
		s.name += "?endpoint=" + cfg.Endpoint
	}
	return s, nil
}

func (s *S3) String() string { return s.name }

// classifyS3 turns a minio-go error into the package's classes.
func classifyS3(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == "NoSuchKey" || resp.StatusCode == http.StatusNotFound && resp.Code != "NoSuchBucket":
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	case resp.Code == "InvalidRange" || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%s %s: %w", op, key, ErrInvalidRange)
	case resp.Code == "NoSuchBucket":
		// The store is misconfigured or not set up: as unusable as a
		// server that is down, and an operator's to mend.
		return fmt.Errorf("%s %s: %w: bucket %s does not exist", op, key, ErrUnavailable, resp.BucketName)
	case resp.StatusCode >= 500, resp.Code == "SlowDown", resp.Code == "RequestTimeout", resp.Code == "InternalError", resp.Code == "ServiceUnavailable":
		return fmt.Errorf("%s %s: %w: %w", op, key, ErrUnavailable, err)
	case resp.Code != "":
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.As(err, &ne), errors.As(err, &ue), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF),
		strings.Contains(err.Error(), "Connection closed by foreign host"):
		return fmt.Errorf("%s %s: %w: %w", op, key, ErrUnavailable, err)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if size < 0 {
		return fmt.Errorf("put %s: negative size %d", key, size)
	}
	// Small objects in one request; chunks are a few MiB.
	return s.put(ctx, "put", key, r, size, minio.PutObjectOptions{DisableMultipart: size <= 64<<20})
}

var _ Creator = (*S3)(nil)

// Create is a conditional PUT (If-None-Match: *): 412 Precondition
// Failed if the key exists.
func (s *S3) Create(ctx context.Context, key string, r io.Reader, size int64) error {
	if size < 0 || size > MaxCreate {
		return fmt.Errorf("create %s: %d bytes: want 0 to %d", key, size, MaxCreate)
	}
	opts := minio.PutObjectOptions{DisableMultipart: true}
	opts.SetMatchETagExcept("*")
	return s.put(ctx, "create", key, r, size, opts)
}

// put is a PUT of size bytes from r with opts (op names it in errors); a
// failed precondition is ErrExists.
func (s *S3) put(ctx context.Context, op, key string, r io.Reader, size int64, opts minio.PutObjectOptions) error {
	if err := ValidKey(key); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	// minio-go sends exactly size bytes and fails on a short reader; the
	// counting reader catches a reader that has more.
	cr := &countReader{r: r}
	_, err := s.client.PutObject(ctx, s.bucket, s.prefix+key, io.LimitReader(cr, size), size, opts)
	if resp := minio.ToErrorResponse(err); err != nil && (resp.StatusCode == http.StatusPreconditionFailed || resp.Code == "PreconditionFailed") {
		return fmt.Errorf("%s %s: %w", op, key, ErrExists)
	}
	if err != nil {
		return classifyS3(op, key, err)
	}
	if n, _ := io.ReadFull(cr, make([]byte, 1)); n > 0 {
		// Too late to keep the object from existing: remove it again.
		s.Delete(ctx, key)
		return fmt.Errorf("%s %s: reader has more than %d bytes", op, key, size)
	}
	return nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (s *S3) get(ctx context.Context, key string, opts minio.GetObjectOptions) (io.ReadCloser, error) {
	if err := ValidKey(key); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	// Core.GetObject sends the request now, so a missing key is known here
	// rather than at the first Read.
	rc, _, _, err := s.core.GetObject(ctx, s.bucket, s.prefix+key, opts)
	if err != nil {
		return nil, classifyS3("get", key, err)
	}
	return &s3Body{rc: rc, key: key}, nil
}

// s3Body classifies errors of reading a body: a connection that breaks
// mid-object is ErrUnavailable.
type s3Body struct {
	rc  io.ReadCloser
	key string
}

func (b *s3Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		err = classifyS3("get", b.key, err)
	}
	return n, err
}

func (b *s3Body) Close() error { return b.rc.Close() }

func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.get(ctx, key, minio.GetObjectOptions{})
}

func (s *S3) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n <= 0 {
		return nil, fmt.Errorf("get %s [%d, +%d): %w", key, off, n, ErrInvalidRange)
	}
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, fmt.Errorf("get %s [%d, +%d): %w", key, off, n, ErrInvalidRange)
	}
	return s.get(ctx, key, opts)
}

func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := ValidKey(key); err != nil {
		return Info{}, fmt.Errorf("stat: %w", err)
	}
	oi, err := s.client.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, classifyS3("stat", key, err)
	}
	return Info{Key: key, Size: oi.Size, ModTime: oi.LastModified}, nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	if err := ValidKey(key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	err := s.client.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{})
	if err != nil && !errors.Is(classifyS3("delete", key, err), ErrNotFound) {
		return classifyS3("delete", key, err)
	}
	return nil
}

func (s *S3) List(ctx context.Context, prefix string) iter.Seq2[Info, error] {
	if err := validPrefix(prefix); err != nil {
		return errSeq(fmt.Errorf("list: %w", err))
	}
	return func(yield func(Info, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // ends minio-go's listing when the caller stops early
		for oi := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{
			Prefix:    s.prefix + prefix,
			Recursive: true,
		}) {
			if oi.Err != nil {
				yield(Info{}, classifyS3("list", prefix, oi.Err))
				return
			}
			key := strings.TrimPrefix(oi.Key, s.prefix)
			if ValidKey(key) != nil {
				continue // not written through this package
			}
			if !yield(Info{Key: key, Size: oi.Size, ModTime: oi.LastModified}, nil) {
				return
			}
		}
	}
}

// MakeBucket creates the bucket if it does not exist; for tests and for
// setting up a store.
func (s *S3) MakeBucket(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return classifyS3("make bucket", s.bucket, err)
	}
	if ok {
		return nil
	}
	if err := s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{}); err != nil {
		return classifyS3("make bucket", s.bucket, err)
	}
	return nil
}
