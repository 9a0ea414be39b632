# airlock: build, test, run. Run `make test` and `make run` as root (sudo):
# the privileged tests and airlockd build network namespaces and nftables.

GO       ?= go
BIN      := bin
FUZZTIME ?= 10000x
# An execution count, not a duration: Go 1.26's fuzz coordinator can fail a
# duration-bounded run with a bare "context deadline exceeded" at the end
# (golang/go#75804, fixed in Go 1.27). Long runs on demand: make fuzz FUZZTIME=10m
GOFLAGS  ?=

.PHONY: all build test test-unit fuzz bench bench-quick lint run clean install uninstall

# Install as a systemd service (as root); DESTDIR stages into another root.
DESTDIR ?=
PREFIX  ?= /usr/local
UNITDIR ?= /etc/systemd/system
PURGE   ?=

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# Everything, privileged tests included: a privileged test that cannot run
# fails instead of skipping.
test: lint
	AIRLOCK_REQUIRE_PRIVILEGED=1 $(GO) test -count=1 -timeout 13m -skip '^TestWeb' ./...
	@GO=$(GO) scripts/webtest.sh
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME)

# Unprivileged quick run for development: privileged tests skip.
test-unit:
	$(GO) test -count=1 ./...

# Every fuzz target, FUZZTIME each.
fuzz:
	@FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh

# Every benchmark against its peers; rewrites BENCHMARKS.md (as root,
# under 10 minutes). bench-quick: the same code paths with less work, in
# under 2 minutes, written to bin/BENCHMARKS-quick.md.
bench:
	@GO=$(GO) scripts/bench.sh

bench-quick:
	@QUICK=1 GO=$(GO) scripts/bench.sh

lint:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

run: build
	@scripts/run.sh

# Binaries to PREFIX/bin, the unit, /etc/airlock/airlockd.yaml (never
# overwritten), /var/lib/airlock (0700). Then: systemctl enable --now airlockd
install: build
	@DESTDIR="$(DESTDIR)" PREFIX="$(PREFIX)" UNITDIR="$(UNITDIR)" BIN="$(BIN)" scripts/install.sh install

# Binaries and unit; PURGE=1 also tears the sandboxes down and removes the
# config and the state directory.
uninstall:
	@DESTDIR="$(DESTDIR)" PREFIX="$(PREFIX)" UNITDIR="$(UNITDIR)" PURGE="$(PURGE)" scripts/install.sh uninstall

clean:
	rm -rf $(BIN)
