package iface

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// maxChunk is the most data one StateGetResponse or StatePutRequest may carry:
// MaxMessageSize less room for the field's tag and length prefix.
const maxChunk = MaxMessageSize - 64

// GRPCServer serves a Backend implementation over the v1 gRPC protocol; it
// runs in the plugin process.
type GRPCServer struct {
	backendv1.UnimplementedBackendServer
	Impl  Backend
	slots slotGate
}

var _ backendv1.BackendServer = (*GRPCServer)(nil)

func (s *GRPCServer) Load(ctx context.Context, req *backendv1.LoadRequest) (*backendv1.LoadResponse, error) {
	info, err := s.Impl.Load(ctx, LoadRequest{
		Model:   req.GetModel(),
		NSlots:  int(req.GetNSlots()),
		Options: req.GetOptions(),
	})
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.LoadResponse{Info: backendInfoToPB(info)}, nil
}

func (s *GRPCServer) Info(ctx context.Context, _ *backendv1.InfoRequest) (*backendv1.InfoResponse, error) {
	info, err := s.Impl.Info(ctx)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.InfoResponse{Info: backendInfoToPB(info)}, nil
}

func (s *GRPCServer) Slot(ctx context.Context, req *backendv1.SlotRequest) (*backendv1.SlotResponse, error) {
	si, err := s.Impl.Slot(ctx, int(req.GetSlot()))
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.SlotResponse{Slot: slotInfoToPB(si)}, nil
}

func (s *GRPCServer) ClearSlot(ctx context.Context, req *backendv1.ClearSlotRequest) (*backendv1.ClearSlotResponse, error) {
	leave, err := s.EnterSlot(ctx, int(req.GetSlot()))
	if err != nil {
		return nil, ToStatus(err)
	}
	defer leave()
	if err := s.Impl.ClearSlot(ctx, int(req.GetSlot())); err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.ClearSlotResponse{}, nil
}

func (s *GRPCServer) Prefill(ctx context.Context, req *backendv1.PrefillRequest) (*backendv1.PrefillResponse, error) {
	leave, err := s.EnterSlot(ctx, int(req.GetSlot()))
	if err != nil {
		return nil, ToStatus(err)
	}
	defer leave()
	res, err := s.Impl.Prefill(ctx, prefillFromPB(req))
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.PrefillResponse{
		Slot:          slotInfoToPB(res.Slot),
		Logits:        res.Logits,
		ModelFallback: res.ModelFallback,
		NReused:       int64(res.Reused),
	}, nil
}

func (s *GRPCServer) Tokenize(ctx context.Context, req *backendv1.PrefillRequest) (*backendv1.TokenizeResponse, error) {
	p, err := s.Impl.Tokenize(ctx, prefillFromPB(req))
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.TokenizeResponse{Tokens: p.Tokens, OpensThinking: p.OpensThinking, Text: []byte(p.Text), Pieces: piecesToPB(p.Pieces)}, nil
}

func (s *GRPCServer) Decode(req *backendv1.DecodeRequest, stream grpc.ServerStreamingServer[backendv1.DecodeResponse]) error {
	leave, err := s.EnterSlot(stream.Context(), int(req.GetSlot()))
	if err != nil {
		return ToStatus(err)
	}
	defer leave()
	res, err := s.Impl.Decode(stream.Context(), DecodeRequest{
		Slot:            int(req.GetSlot()),
		NPredict:        int(req.GetNPredict()),
		Sampler:         samplerFromPB(req.GetSampler()),
		Logprobs:        req.GetLogprobs(),
		NProbs:          int(req.GetNProbs()),
		NKeep:           int(req.GetNKeep()),
		Prompt:          promptFromPB(req.GetPrompt()),
		Output:          outputFromPB(req.GetOutput()),
		Speculative:     speculativeFromPB(req.GetSpeculative()),
		LastUnevaluated: req.GetLastUnevaluated(),
	}, func(t Token) error {
		// A failed Send means the host is gone or gave up (its emit failed and
		// it cancelled); fromStatus turns that into context.Canceled for the
		// backend.
		return FromStatus(stream.Send(&backendv1.DecodeResponse{
			Event: &backendv1.DecodeResponse_Token{Token: tokenToPB(t)},
		}))
	})
	if err != nil {
		return ToStatus(err)
	}
	return ToStatus(stream.Send(&backendv1.DecodeResponse{
		Event: &backendv1.DecodeResponse_Result{Result: &backendv1.DecodeResult{
			TokensGenerated: int64(res.TokensGenerated),
			NPast:           int64(res.NPast),
			StopReason:      res.StopReason,
			Prompt:          promptResultToPB(res.Prompt),
			Message:         replyToPB(res.Message),
			Deltas:          deltasToPB(res.Deltas),
			DraftTokens:     int64(res.DraftTokens),
			DraftAccepted:   int64(res.DraftAccepted),
		}},
	}))
}

func (s *GRPCServer) StateGet(req *backendv1.StateGetRequest, stream grpc.ServerStreamingServer[backendv1.StateGetResponse]) error {
	chunk := req.GetChunkSize()
	if chunk <= 0 || chunk > maxChunk {
		chunk = maxChunk
	}
	leave, err := s.EnterSlot(stream.Context(), int(req.GetSlot()))
	if err != nil {
		return ToStatus(err)
	}
	defer leave()
	w := &stateWriter{stream: stream, chunk: int(chunk)}
	_, err = s.Impl.StateGet(stream.Context(), int(req.GetSlot()), int(chunk), w)
	return ToStatus(err)
}

// stateWriter sends each Write as StateGetResponse messages of at most chunk
// bytes. It does not retain p: Send marshals the message into its own buffer
// before returning (grpc-go serverStream.SendMsg → prepareMsg → codec
// Marshal), and only stats handlers or x/net/trace (grpc.EnableTracing) could
// keep the message afterwards; the plugin server installs neither.
type stateWriter struct {
	stream grpc.ServerStreamingServer[backendv1.StateGetResponse]
	chunk  int
}

func (w *stateWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		end := min(len(p), n+w.chunk)
		if err := w.stream.Send(&backendv1.StateGetResponse{Data: p[n:end]}); err != nil {
			return n, FromStatus(err)
		}
		n = end
	}
	return n, nil
}

func (s *GRPCServer) StatePut(stream grpc.ClientStreamingServer[backendv1.StatePutRequest, backendv1.StatePutResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return ToStatus(fmt.Errorf("%w: StatePut stream without a header", ErrBadRequest))
		}
		return ToStatus(FromStatus(err))
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return ToStatus(fmt.Errorf("%w: StatePut stream must start with a header", ErrBadRequest))
	}
	if hdr.GetSize() < 0 {
		return ToStatus(fmt.Errorf("%w: negative state size %d", ErrBadRequest, hdr.GetSize()))
	}
	leave, err := s.EnterSlot(stream.Context(), int(hdr.GetSlot()))
	if err != nil {
		return ToStatus(err)
	}
	defer leave()
	r := &stateReader{stream: stream, size: hdr.GetSize()}
	consumed, err := s.Impl.StatePut(stream.Context(), int(hdr.GetSlot()), hdr.GetTokens(), r, hdr.GetSize())
	if err != nil {
		return ToStatus(err)
	}
	// The contract has the backend read r to its end; finish it for one that
	// stopped early, so a success always means the host's bytes all arrived.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return ToStatus(err)
	}
	return ToStatus(stream.SendAndClose(&backendv1.StatePutResponse{Consumed: consumed}))
}

// stateReader reads the data messages of a StatePut stream. It holds exactly
// the header's size bytes: a stream that ends early reads as
// io.ErrUnexpectedEOF, one that carries more as ErrBadRequest, and a host that
// aborts as context.Canceled, so a backend never mistakes a truncated state
// for a whole one.
type stateReader struct {
	stream grpc.ClientStreamingServer[backendv1.StatePutRequest, backendv1.StatePutResponse]
	size   int64  // declared in the header
	recvd  int64  // data bytes received so far
	buf    []byte // unread rest of the current message
	err    error  // sticky, returned once buf is empty
}

func (r *stateReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		msg, err := r.stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			if r.recvd < r.size {
				r.err = fmt.Errorf("state stream ended after %d of %d bytes: %w", r.recvd, r.size, io.ErrUnexpectedEOF)
			} else {
				r.err = io.EOF
			}
		case err != nil:
			r.err = FromStatus(err)
		case msg.GetHeader() != nil:
			r.err = fmt.Errorf("%w: StatePut header repeated mid-stream", ErrBadRequest)
		default:
			data := msg.GetData()
			r.recvd += int64(len(data))
			if r.recvd > r.size {
				r.err = fmt.Errorf("%w: state stream carries more than the declared %d bytes", ErrBadRequest, r.size)
			} else {
				r.buf = data
			}
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (s *GRPCServer) SetExpertMode(ctx context.Context, req *backendv1.SetExpertModeRequest) (*backendv1.SetExpertModeResponse, error) {
	mode, err := s.Impl.SetExpertMode(ctx, req.GetMode())
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.SetExpertModeResponse{Mode: mode}, nil
}

func (s *GRPCServer) SwapQuant(ctx context.Context, req *backendv1.SwapQuantRequest) (*backendv1.SwapQuantResponse, error) {
	res, err := s.Impl.SwapQuant(ctx, req.GetQuantKey(), req.GetTensorPattern())
	if err != nil {
		return nil, ToStatus(err)
	}
	return swapResultToPB(res), nil
}

func (s *GRPCServer) LendWeights(ctx context.Context, _ *backendv1.LendWeightsRequest) (*backendv1.WeightRegistry, error) {
	reg, err := s.Impl.LendWeights(ctx)
	if err != nil {
		return nil, ToStatus(err)
	}
	return registryToPB(reg), nil
}

func (s *GRPCServer) BindPeer(ctx context.Context, req *backendv1.WeightRegistry) (*backendv1.BindPeerResponse, error) {
	reg := registryFromPB(req)
	if err := reg.Check(); err != nil {
		return nil, ToStatus(fmt.Errorf("%w: the peer's weights: %w", ErrBadRequest, err))
	}
	res, err := s.Impl.BindPeer(ctx, reg)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.BindPeerResponse{Mode: res.Mode, Reason: res.Reason, Bound: int32(res.Bound)}, nil
}

func (s *GRPCServer) Embed(ctx context.Context, req *backendv1.EmbedRequest) (*backendv1.EmbedResponse, error) {
	embs, err := s.Impl.Embed(ctx, embedRequestFromPB(req))
	if err != nil {
		return nil, ToStatus(err)
	}
	if len(embs) != len(req.GetInputs()) {
		return nil, ToStatus(fmt.Errorf("the backend returned %d embeddings for %d inputs", len(embs), len(req.GetInputs())))
	}
	resp := &backendv1.EmbedResponse{Embeddings: make([]*backendv1.Embedding, len(embs))}
	size := 0
	for i, e := range embs {
		if resp.Embeddings[i], err = embeddingToPB(e); err != nil {
			return nil, ToStatus(err)
		}
		size += 4*len(resp.Embeddings[i].Values) + 32
	}
	// One reply carries them all: a request whose embeddings (pooling none
	// gives one a token) outgrow it is the client's to split.
	if size > maxChunk {
		return nil, ToStatus(fmt.Errorf("%w: the embeddings take %d bytes, more than one reply of %d carries: send fewer inputs",
			ErrBadRequest, size, maxChunk))
	}
	return resp, nil
}

func (s *GRPCServer) SlotCheckpoint(ctx context.Context, req *backendv1.SlotRequest) (*backendv1.SlotCheckpointResponse, error) {
	c, err := s.Impl.SlotCheckpoint(ctx, int(req.GetSlot()))
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.SlotCheckpointResponse{Checkpoint: checkpointToPB(c)}, nil
}

func (s *GRPCServer) PutCheckpoint(ctx context.Context, req *backendv1.PutCheckpointRequest) (*backendv1.PutCheckpointResponse, error) {
	leave, err := s.EnterSlot(ctx, int(req.GetSlot()))
	if err != nil {
		return nil, ToStatus(err)
	}
	defer leave()
	c := checkpointFromPB(req.GetCheckpoint())
	if c == nil {
		return nil, ToStatus(fmt.Errorf("%w: PutCheckpoint without a checkpoint", ErrBadRequest))
	}
	kept, why, err := s.Impl.PutCheckpoint(ctx, int(req.GetSlot()), *c)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &backendv1.PutCheckpointResponse{Kept: kept, Why: why}, nil
}
