# PandaStack. `make up` sets up this host (Debian 12) and starts the
# all-in-one server; `make test` runs every test. See README.md.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

DATA_DIR ?= /var/lib/pandastack
IMAGES   ?= $(DATA_DIR)/images
GO       ?= go
# VERSION is what `panda --version` and the guest agent report.
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
GOFILES  := $(shell find cmd internal api sdk/go -name '*.go' 2>/dev/null) go.mod $(wildcard go.sum)
# The web console's sources and its bundle (see the console target).
CONSOLE_SRC := $(shell find web/console/src -type f 2>/dev/null) web/console/build.mjs
CONSOLE     := internal/controlplane/console/dist/index.html

.PHONY: all build setup up unit test test-main test-clients test-go test-race fuzz bench clean check-go e2b-deps s3-deps console generate

all: build

check-go:
	@command -v $(GO) >/dev/null || { echo "Go is missing: install Go 1.26 into /usr/local/go (see README)"; exit 1; }

build: check-go bin/panda bin/panda-guest

bin/panda: $(GOFILES) $(CONSOLE)
	$(GO) build -ldflags='-X main.version=$(VERSION)' -o $@ ./cmd/panda

# console bundles the web console (web/console: Preact, htm, xterm.js, by
# esbuild) into internal/controlplane/console/dist, which bin/panda embeds. Its npm
# packages are pinned by web/console/package-lock.json and installed with
# npm ci from the npm registry when the lock file changes; the bundle is
# rebuilt when a source changes. package.json's allowScripts lets esbuild's
# install script (it checks its platform binary) run, the one script among
# them: npm 11 warns of unlisted ones, npm 12 skips them. Without Node.js,
# setup.sh deps installs it (Debian's). The bundle is not committed: see
# docs/architecture.md.

console: $(CONSOLE)

web/console/node_modules/.installed: web/console/package.json web/console/package-lock.json
	@command -v npm >/dev/null || scripts/setup.sh deps
	cd web/console && npm ci --no-audit --no-fund
	touch $@

$(CONSOLE): web/console/node_modules/.installed $(CONSOLE_SRC)
	cd web/console && node build.mjs

# The guest agent is static: it runs as PID 1 in guests without a libc.
bin/panda-guest: $(GOFILES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w -X main.version=$(VERSION)' -o $@ ./cmd/panda-guest

# setup installs missing host packages and builds the guest images (kernel,
# guest agent, initramfs, root filesystems). Idempotent; scripts/setup_test.go
# runs the same images step into an empty directory in every `make test`.
setup: build
	@IMAGES=$(IMAGES) scripts/setup.sh deps
	@IMAGES=$(IMAGES) scripts/setup.sh images bin/panda-guest

# --bake-network: a Dockerfile's RUN steps reach the network (pip install,
# apt-get, git clone), under the same default egress policy as sandboxes,
# which are online anyway: a build VM reaches nothing a sandbox of the same
# key could not. panda up's own default stays off (docs/dockerfile.md).
up: setup
	bin/panda up --data-dir $(DATA_DIR) --bake --bake-network

# e2b-deps installs the official e2b and @e2b/code-interpreter SDKs the
# E2B suites and `panda bench exec` run (e2e/e2b, pinned by its
# package-lock.json; from the npm
# registry), when node_modules is older than the lock file. Before the Go
# tests: two packages use it, and npm ci would remove it under the other.
e2b-deps: e2e/e2b/node_modules/.installed

e2e/e2b/node_modules/.installed: e2e/e2b/package.json e2e/e2b/package-lock.json
	cd e2e/e2b && npm ci --no-audit --no-fund
	touch $@

# s3-deps builds versitygw, the S3-compatible server the object-store
# tests run as a process (internal/testing/s3test), with `go install`
# from the Go module proxy into TOOLS_DIR (outside the tree: `make clean`
# keeps it). The file name carries the version, so the build runs once
# per version. s3test.Version names the same version (a test checks).
VERSITYGW_VERSION := v1.8.0
TOOLS_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/pandastack-tools
VERSITYGW := $(TOOLS_DIR)/versitygw-$(VERSITYGW_VERSION)
export PANDA_VERSITYGW := $(VERSITYGW)

s3-deps: $(VERSITYGW)

$(VERSITYGW):
	@command -v $(GO) >/dev/null || { echo "Go is missing: install Go 1.26 into /usr/local/go (see README)"; exit 1; }
	rm -rf $(TOOLS_DIR)/.build && mkdir -p $(TOOLS_DIR)/.build
	GOBIN=$(TOOLS_DIR)/.build $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)
	mv $(TOOLS_DIR)/.build/versitygw $@ && rm -rf $(TOOLS_DIR)/.build

# unit is the fast tier: every test that needs no root, guest VM,
# PostgreSQL or S3 server, with the race detector. -short makes testkit's
# gates skip the others (internal/testing/testkit); `make test` runs them.
# Test results are cached: a package whose code and tests did not change
# answers at once (UNITFLAGS=-count=1 runs everything again). The race
# runtime sleeps a second at the exit of every test binary to catch late
# reports; GORACE=atexit_sleep_ms=0 saves that half-minute over the tree.
UNITFLAGS ?=
unit: check-go
	GORACE=atexit_sleep_ms=0 $(GO) test -short -race -timeout 5m $(UNITFLAGS) ./...

# RACE_PKGS are the concurrent packages whose whole suites, VM tests
# included, `make test` runs with the race detector (test-race) instead of
# without it: the host RPC's streams (hostapi), the guest protocol's mux
# (guestproto) and the control loops (controlplane, fleet, events).
# `make unit` covers every package's fast tests with it.
RACE_PKGS := internal/hostagent/hostapi internal/contract/guestproto \
	internal/controlplane internal/controlplane/fleet internal/controlplane/events
# RACE_AGENT are the host agent's tests of concurrent operations on one
# sandbox (a kill against a create, a capture, a fork; creates at once;
# pauses) and of its store jobs (uploads, garbage collection), which
# test-race runs again with the race detector: its whole suite under
# -race would take most of an hour here.
RACE_AGENT := 'TestConcurrentCreates|TestKillWinsOverACreate|TestKillDuringAHungCapture|TestStreamSurvivesFork|TestForkOfPausedSandboxConflicts|TestKillLeavesNoHalfSandbox|TestPauseResumeThreeTimes|TestVMMDeathAfterAPauseCapture|TestSnapshotsDurableInTheStore|TestGarbageCollectionPutOff'
null :=
space := $(null) $(null)
RACE_RE := $(subst $(space),|,$(strip $(RACE_PKGS)))

# test-race runs RACE_PKGS and RACE_AGENT with the race detector (about
# three minutes); `make test` runs it after the other Go tests.
test-race: check-go s3-deps
	PANDA_TEST_IMAGES=$(IMAGES) GORACE=atexit_sleep_ms=0 $(GO) test -race -count=1 -timeout 20m $(addprefix ./,$(RACE_PKGS))
	PANDA_TEST_IMAGES=$(IMAGES) GORACE=atexit_sleep_ms=0 $(GO) test -race -count=1 -timeout 20m -run $(RACE_AGENT) ./internal/hostagent/

# test runs every test, then every fuzz target for a few seconds (fuzz).
# The host agent's tests (internal/hostagent: many guests, several agents
# sharing an object store, lazy restore) run first and alone: next to the
# other packages' guests their disk writes starved bakes on 2 cores. Then
# the other packages (test-main) and, next to them, the clients' suites
# (test-clients); then test-race (the packages of RACE_PKGS, with the
# race detector) and the fuzz targets, each alone: both keep the cores
# busy by themselves.
test: setup e2b-deps s3-deps
	PANDA_TEST_IMAGES=$(IMAGES) PANDA_BIN=$(CURDIR)/bin/panda $(GO) test -count=1 -timeout 40m ./internal/hostagent/
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-main test-clients
	@$(MAKE) --no-print-directory test-race
	@$(MAKE) --no-print-directory fuzz

# test-main runs the packages but the host agent's and RACE_PKGS, two at
# a time (go test's -p is the number of cores). cmd/panda is its long
# pole (about 17 minutes; its tests run one after another, waiting on
# guests under TCG: 0.8 of a core on average), and the other packages end
# minutes before it. test-clients, about 0.7 of a core, fills that room:
# `make test` runs both as jobs of one make -j2, each target's output
# printed whole when it ends.
test-main: check-go e2b-deps s3-deps
	PANDA_TEST_IMAGES=$(IMAGES) PANDA_BIN=$(CURDIR)/bin/panda $(GO) test -count=1 -timeout 40m $$($(GO) list ./... | grep -v -E '/internal/hostagent$$|/($(RACE_RE))$$')

# test-clients runs the REST suite again with its host behind the host API
# (PANDA_TEST_HOST=remote) and the Python SDK's suite (sdk/python/tests):
# one `panda up` or agent at a time, each mostly waiting on its guests.
test-clients: check-go s3-deps
	PANDA_TEST_IMAGES=$(IMAGES) PANDA_TEST_HOST=remote $(GO) test -count=1 -timeout 20m ./internal/controlplane/rest/
	PANDA_TEST_IMAGES=$(IMAGES) PANDA_BIN=$(CURDIR)/bin/panda python3 -m unittest discover -s sdk/python/tests

# generate writes what is generated from the REST contract,
# api/openapi.yaml: the Go SDK's wire types
# (sdk/go/internal/wire/wire.gen.go, by oapi-codegen, whose version its
# go:generate line pins) and the JSON copy of the document that the
# Python SDK's tests read (sdk/python/tests/openapi.json). Run it after
# changing the document and commit what it wrote: tests fail while
# either is stale (docs/api.md, "Changing the contract").
generate: check-go
	$(GO) generate ./api/... ./sdk/go/...

# fuzz runs each Go fuzz target (func FuzzX) for FUZZTIME (default 5s; e.g.
# `make fuzz FUZZTIME=10m` for a longer run). See README.md, "Tests".
FUZZTIME ?= 5s
fuzz: check-go
	FUZZTIME=$(FUZZTIME) PANDA_TEST_IMAGES=$(IMAGES) scripts/fuzz.sh

bench: setup
	bin/panda bench create --data-dir $(DATA_DIR) --template base --n 50

clean:
	rm -rf bin
