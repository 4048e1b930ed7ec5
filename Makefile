# napd — build, test and lint. `make help` lists the targets.

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

# Every Go file of the module's packages (go list skips .cache, testdata and
# the systemd test box, which a plain `gofmt -l .` would walk into).
GOFILES = $(shell $(GO) list -e -f '{{$$d := .Dir}}{{range .GoFiles}}{{$$d}}/{{.}} {{end}}{{range .TestGoFiles}}{{$$d}}/{{.}} {{end}}{{range .XTestGoFiles}}{{$$d}}/{{.}} {{end}}{{range .IgnoredGoFiles}}{{$$d}}/{{.}} {{end}}' ./...)

.PHONY: help build test test-deps lint fuzz run bench bench-deps clean deb

help:
	@echo "make build   build napd, napctl and napd-demo-engine into bin/"
	@echo "make test    install missing test packages, run every test with -race"
	@echo "make lint    gofmt, go vet, staticcheck"
	@echo "make fuzz    every fuzz target of napd's parsers, FUZZTIME (10s) each"
	@echo "make run     run napd on etc/napd/demo.toml (demo engines, no GPU)"
	@echo "make bench   wrk vs nginx vs direct, proxy cost, streams, wake, scale -> docs/bench.md (~7 min)"
	@echo "             LLAMA_SERVER=PATH GGUF=FILE: on llama.cpp's llama-server too; NAPD_B=DIR: another napd beside"
	@echo "make clean   remove bin/"
	@echo "make deb     build the Debian package dist/napd_<version>_<arch>.deb"

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/...

test-deps:
	scripts/test-deps.sh

# Every benchmark runs once too, so that none stops working unnoticed.
test: test-deps
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./...

fuzz:
	scripts/fuzz.sh

lint:
	@unformatted=$$(gofmt -l $(GOFILES) </dev/null); \
	if [ -n "$$unformatted" ]; then echo "gofmt -w needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

run: build
	PATH=$(CURDIR)/bin:$$PATH bin/napd --config etc/napd/demo.toml

clean:
	rm -rf bin/

deb:
	GO=$(GO) packaging/build-deb.sh dist

bench-deps:
	scripts/bench-deps.sh

# Proxy cost (wrk beside nginx and direct, and the bench's own client),
# streams, wake and scale figures, written to docs/bench.md. With
# LLAMA_SERVER and GGUF (llama.cpp's llama-server and a model for it), the
# same on that real engine too; with NAPD_B (a directory holding another
# napd binary), that napd measured beside this tree's in the wrk tables.
bench: build bench-deps
	$(GO) run ./bench -bin bin -out docs/bench.md \
		$(if $(LLAMA_SERVER),-llama-server '$(LLAMA_SERVER)') $(if $(GGUF),-gguf '$(GGUF)') \
		$(if $(NAPD_B),-napd-b '$(NAPD_B)')
