# Shortcuts; each target is the plain Go command shown.
.PHONY: test demo ci fmt vet

test: ## go test ./...
	go test ./...

demo: ## go run ./cmd/outbox-demo
	go run ./cmd/outbox-demo

vet:
	go vet ./...

fmt:
	gofmt -l -w .

ci: ## what CI runs: gofmt, vet, tests, demo, benchmark smoke test
	bash .ci/run
