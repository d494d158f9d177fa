package iface

// The generated code lives in iface/proto/hydra/backend/v1 and is committed.
// Regenerate it after changing the .proto (which, once released, means adding
// a new versioned package, never editing v1) with `go generate ./iface` or,
// from the repository root with protoc-gen-go and protoc-gen-go-grpc on PATH:
//
//	protoc --go_out=. --go_opt=module=github.com/hydra-engine/hydra-engine --go-grpc_out=. --go-grpc_opt=module=github.com/hydra-engine/hydra-engine iface/proto/hydra/backend/v1/backend.proto
//
// The module= options make the output paths follow go_package, so the files
// land next to the .proto. The committed files come from protoc 3.21,
// protoc-gen-go v1.36.12 and protoc-gen-go-grpc v1.5.1 (recorded in their
// headers); other versions give noisy diffs.

//go:generate sh -c "cd .. && PATH=\"$PATH:$(go env GOPATH)/bin\" protoc --go_out=. --go_opt=module=github.com/hydra-engine/hydra-engine --go-grpc_out=. --go-grpc_opt=module=github.com/hydra-engine/hydra-engine iface/proto/hydra/backend/v1/backend.proto"
