package cudallama

import (
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
)

// Options of context checkpoints (checkpoints.go, internal/ckpt), taken
// only where a sequence's memory cannot be cut back: a hybrid or recurrent
// model, a sliding window without swa_full.
const (
	// OptCtxCheckpoints is the checkpoints a slot keeps, llama-server's
	// --ctx-checkpoints (32); 0: none.
	OptCtxCheckpoints = "ctx_checkpoints"
	// OptCheckpointMinStep is the least spacing in tokens between a slot's
	// checkpoints, except near a prompt's end and at its last user message,
	// llama-server's --checkpoint-min-step (8192).
	OptCheckpointMinStep = "checkpoint_min_step"
	// OptCheckpointRAM is the host memory every slot's checkpoints share, in
	// MiB; the oldest are dropped to stay within it. -1: no limit in bytes
	// (llama-server has none: only the count per slot).
	OptCheckpointRAM = "checkpoint_ram"

	// DefaultCheckpointRAM is the checkpoints' default budget in MiB:
	// llama-server's --cache-ram default, room for 32 checkpoints of two
	// slots of the production hybrid (63 MiB each) twice over.
	DefaultCheckpointRAM = 8192
	maxCtxCheckpoints    = 1 << 16
)

// ckptOptions are the parsed checkpoint options.
type ckptOptions struct {
	ctxCheckpoints    int
	checkpointMinStep int
	checkpointRAM     int64 // MiB; -1: no limit
}

func defaultCkptOptions() ckptOptions {
	return ckptOptions{ctxCheckpoints: ckpt.DefaultMax, checkpointMinStep: ckpt.DefaultMinStep, checkpointRAM: DefaultCheckpointRAM}
}

// ckptParsers are the options of this file, merged into optionParsers.
var ckptParsers = map[string]optionParser{
	OptCtxCheckpoints:    intField(func(o *options) *int { return &o.ctxCheckpoints }, 0, maxCtxCheckpoints),
	OptCheckpointMinStep: intField(func(o *options) *int { return &o.checkpointMinStep }, 0, maxNCtx),
	OptCheckpointRAM: func(o *options, key, v string) error {
		n, err := iface.ParseIntOption(key, v, -1, maxCacheRAM)
		o.checkpointRAM = int64(n)
		return err
	},
}
