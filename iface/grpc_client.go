package iface

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"google.golang.org/grpc"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// DefaultPutPieceSize is how much of the state StatePut sends per message by
// default: large enough that per-message overhead vanishes, small enough to
// stay under gRPC's stock 4 MiB receive limit, so even a plugin server whose
// limits were not raised (plugin.TestPluginGRPCConn's) accepts it.
const DefaultPutPieceSize = 1 << 20

// GRPCClient is a Backend that forwards every call to a plugin over the v1
// gRPC protocol; the host uses it in place of the plugin's implementation.
type GRPCClient struct {
	client backendv1.BackendClient

	conn grpc.ClientConnInterface
	// putPiece is the data carried per StatePut message, a test hook; 0
	// means DefaultPutPieceSize. Values above what one message can carry
	// under MaxMessageSize are lowered to fit.
	putPiece int
}

var _ Backend = (*GRPCClient)(nil)

// NewGRPCClient returns a Backend talking to the plugin served on conn.
func NewGRPCClient(conn grpc.ClientConnInterface) *GRPCClient {
	return &GRPCClient{client: backendv1.NewBackendClient(conn), conn: conn}
}

// Conn is the plugin connection, for a data plane that adds calls of its own
// (transport/shm).
func (c *GRPCClient) Conn() grpc.ClientConnInterface { return c.conn }

func (c *GRPCClient) Load(ctx context.Context, req LoadRequest) (BackendInfo, error) {
	resp, err := c.client.Load(ctx, &backendv1.LoadRequest{
		Model:   req.Model,
		NSlots:  int64(req.NSlots),
		Options: req.Options,
	})
	if err != nil {
		return BackendInfo{}, FromStatus(err)
	}
	return backendInfoFromPB(resp.GetInfo()), nil
}

func (c *GRPCClient) Info(ctx context.Context) (BackendInfo, error) {
	resp, err := c.client.Info(ctx, &backendv1.InfoRequest{})
	if err != nil {
		return BackendInfo{}, FromStatus(err)
	}
	return backendInfoFromPB(resp.GetInfo()), nil
}

func (c *GRPCClient) Slot(ctx context.Context, slot int) (SlotInfo, error) {
	resp, err := c.client.Slot(ctx, &backendv1.SlotRequest{Slot: int64(slot)})
	if err != nil {
		return SlotInfo{}, FromStatus(err)
	}
	return slotInfoFromPB(resp.GetSlot()), nil
}

func (c *GRPCClient) ClearSlot(ctx context.Context, slot int) error {
	_, err := c.client.ClearSlot(ctx, &backendv1.ClearSlotRequest{Slot: int64(slot)})
	return FromStatus(err)
}

func (c *GRPCClient) Prefill(ctx context.Context, req PrefillRequest) (PrefillResult, error) {
	resp, err := c.client.Prefill(ctx, prefillToPB(req))
	if err != nil {
		return PrefillResult{}, FromStatus(err)
	}
	return PrefillResult{
		Slot:          slotInfoFromPB(resp.GetSlot()),
		Logits:        resp.GetLogits(),
		ModelFallback: resp.GetModelFallback(),
		Reused:        int(resp.GetNReused()),
	}, nil
}

func (c *GRPCClient) Tokenize(ctx context.Context, req PrefillRequest) (Prompt, error) {
	resp, err := c.client.Tokenize(ctx, prefillToPB(req))
	if err != nil {
		return Prompt{}, FromStatus(err)
	}
	return Prompt{Tokens: resp.GetTokens(), OpensThinking: resp.GetOpensThinking(), Text: string(resp.GetText()), Pieces: piecesFromPB(resp.GetPieces())}, nil
}

func (c *GRPCClient) Decode(ctx context.Context, req DecodeRequest, emit func(Token) error) (DecodeResult, error) {
	// Cancelling the stream is how the plugin learns to stop generating when
	// emit fails.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.client.Decode(ctx, &backendv1.DecodeRequest{
		Slot:            int64(req.Slot),
		NPredict:        int64(req.NPredict),
		Sampler:         samplerToPB(req.Sampler),
		Logprobs:        req.Logprobs,
		NProbs:          int32(min(max(req.NProbs, 0), math.MaxInt32)),
		NKeep:           int64(req.NKeep),
		Prompt:          promptToPB(req.Prompt),
		Output:          outputToPB(req.Output),
		Speculative:     speculativeToPB(req.Speculative),
		LastUnevaluated: req.LastUnevaluated,
	})
	if err != nil {
		return DecodeResult{}, FromStatus(err)
	}
	var result *backendv1.DecodeResult
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return DecodeResult{}, FromStatus(err)
		}
		switch ev := msg.GetEvent().(type) {
		case *backendv1.DecodeResponse_Token:
			if result != nil {
				return DecodeResult{}, errors.New("backend plugin: Decode sent a token after its result")
			}
			if err := emit(tokenFromPB(ev.Token)); err != nil {
				cancel()
				return DecodeResult{}, err
			}
		case *backendv1.DecodeResponse_Result:
			result = ev.Result
		default:
			return DecodeResult{}, fmt.Errorf("backend plugin: unexpected Decode message %T", ev)
		}
	}
	if result == nil {
		return DecodeResult{}, errors.New("backend plugin: Decode stream ended without a result")
	}
	return DecodeResult{
		TokensGenerated: int(result.GetTokensGenerated()),
		NPast:           int(result.GetNPast()),
		StopReason:      result.GetStopReason(),
		Prompt:          promptResultFromPB(result.GetPrompt()),
		Message:         replyFromPB(result.GetMessage()),
		Deltas:          deltasFromPB(result.GetDeltas()),
		DraftTokens:     int(result.GetDraftTokens()),
		DraftAccepted:   int(result.GetDraftAccepted()),
	}, nil
}

// StateGet copies the streamed state to w and returns the bytes written to w.
// chunkSize <= 0 asks for the largest chunks a message can carry.
func (c *GRPCClient) StateGet(ctx context.Context, slot int, chunkSize int, w io.Writer) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.client.StateGet(ctx, &backendv1.StateGetRequest{Slot: int64(slot), ChunkSize: int64(chunkSize)})
	if err != nil {
		return 0, FromStatus(err)
	}
	var n int64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, FromStatus(err)
		}
		data := msg.GetData()
		m, werr := w.Write(data)
		n += int64(m)
		if werr == nil && m < len(data) {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			// Stop the plugin producing state nobody will read.
			cancel()
			return n, werr
		}
	}
}

// StatePut sends exactly size bytes of r after a header. A reader that fails
// or ends early ends the stream short, so the plugin sees a truncated state
// rather than a complete one; the reader's error (io.ErrUnexpectedEOF when it
// ended early) is returned once the plugin has finished.
func (c *GRPCClient) StatePut(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
	if size < 0 {
		return 0, fmt.Errorf("%w: negative state size %d", ErrBadRequest, size)
	}
	piece := c.putPiece
	if piece <= 0 {
		piece = DefaultPutPieceSize
	}
	piece = min(piece, maxChunk)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.client.StatePut(ctx)
	if err != nil {
		return 0, FromStatus(err)
	}
	err = stream.Send(&backendv1.StatePutRequest{Msg: &backendv1.StatePutRequest_Header{
		Header: &backendv1.StatePutHeader{Slot: int64(slot), Tokens: tokens, Size: size},
	}})
	// Send returns io.EOF once the plugin has ended the call (e.g. it
	// rejected the slot without reading); CloseAndRecv then yields its status.
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, FromStatus(err)
	}

	var buf []byte
	if err == nil && size > 0 {
		buf = make([]byte, min(int64(piece), size))
	}
	for sent := int64(0); err == nil && sent < size; {
		n, rerr := io.ReadFull(r, buf[:min(int64(len(buf)), size-sent)])
		if n > 0 {
			// Reusing buf afterwards is safe: Send marshals the message into
			// its own buffer before returning.
			err = stream.Send(&backendv1.StatePutRequest{Msg: &backendv1.StatePutRequest_Data{Data: buf[:n]}})
			if err != nil && !errors.Is(err, io.EOF) {
				return 0, FromStatus(err)
			}
			sent += int64(n)
		}
		if rerr != nil {
			// Half-close rather than cancel, and wait for the plugin: it sees
			// the stream end short of size, fails and empties the slot before
			// this returns, so the caller never races a restore still running.
			_, _ = stream.CloseAndRecv()
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
				return 0, fmt.Errorf("state reader ended after %d of %d bytes: %w", sent, size, io.ErrUnexpectedEOF)
			}
			return 0, rerr
		}
	}

	resp, err := stream.CloseAndRecv()
	if err != nil {
		return 0, FromStatus(err)
	}
	return resp.GetConsumed(), nil
}

func (c *GRPCClient) SetExpertMode(ctx context.Context, mode string) (string, error) {
	resp, err := c.client.SetExpertMode(ctx, &backendv1.SetExpertModeRequest{Mode: mode})
	if err != nil {
		return "", FromStatus(err)
	}
	return resp.GetMode(), nil
}

func (c *GRPCClient) Embed(ctx context.Context, req EmbedRequest) ([]Embedding, error) {
	resp, err := c.client.Embed(ctx, embedRequestToPB(req))
	if err != nil {
		return nil, FromStatus(err)
	}
	if n := len(resp.GetEmbeddings()); n != len(req.Inputs) {
		return nil, fmt.Errorf("backend plugin: Embed returned %d embeddings for %d inputs", n, len(req.Inputs))
	}
	out := make([]Embedding, len(req.Inputs))
	for i, pb := range resp.GetEmbeddings() {
		if out[i], err = embeddingFromPB(pb); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (c *GRPCClient) SwapQuant(ctx context.Context, quantKey, tensorPattern string) (SwapResult, error) {
	resp, err := c.client.SwapQuant(ctx, &backendv1.SwapQuantRequest{QuantKey: quantKey, TensorPattern: tensorPattern})
	if err != nil {
		return SwapResult{}, FromStatus(err)
	}
	return swapResultFromPB(resp), nil
}

func (c *GRPCClient) LendWeights(ctx context.Context) (WeightRegistry, error) {
	resp, err := c.client.LendWeights(ctx, &backendv1.LendWeightsRequest{})
	if err != nil {
		return WeightRegistry{}, FromStatus(err)
	}
	return registryFromPB(resp), nil
}

func (c *GRPCClient) BindPeer(ctx context.Context, reg WeightRegistry) (ExpertModeResult, error) {
	resp, err := c.client.BindPeer(ctx, registryToPB(reg))
	if err != nil {
		return ExpertModeResult{}, FromStatus(err)
	}
	return ExpertModeResult{Mode: resp.GetMode(), Reason: resp.GetReason(), Bound: int(resp.GetBound())}, nil
}

func (c *GRPCClient) SlotCheckpoint(ctx context.Context, slot int) (*Checkpoint, error) {
	resp, err := c.client.SlotCheckpoint(ctx, &backendv1.SlotRequest{Slot: int64(slot)})
	if err != nil {
		return nil, FromStatus(err)
	}
	return checkpointFromPB(resp.GetCheckpoint()), nil
}

func (c *GRPCClient) PutCheckpoint(ctx context.Context, slot int, cp Checkpoint) (bool, string, error) {
	resp, err := c.client.PutCheckpoint(ctx, &backendv1.PutCheckpointRequest{Slot: int64(slot), Checkpoint: checkpointToPB(&cp)})
	if err != nil {
		return false, "", FromStatus(err)
	}
	return resp.GetKept(), resp.GetWhy(), nil
}
