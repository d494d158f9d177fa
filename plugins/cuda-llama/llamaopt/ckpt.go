package llamaopt

import (
	"fmt"

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

// CkptOptions are the parsed checkpoint options.
type CkptOptions struct {
	CtxCheckpoints    int
	CheckpointMinStep int
	CheckpointRAM     int64 // MiB; -1: no limit
}

func defaultCkptOptions() CkptOptions {
	return CkptOptions{CtxCheckpoints: ckpt.DefaultMax, CheckpointMinStep: ckpt.DefaultMinStep, CheckpointRAM: DefaultCheckpointRAM}
}

// ckptOptions are the options of this file, in the table.
var ckptOptions = []option{
	{key: OptCtxCheckpoints, def: "32", doc: "context checkpoints a slot keeps where its memory cannot be cut (llama-server's --ctx-checkpoints); 0 none",
		parse: intField(func(o *Options) *int { return &o.CtxCheckpoints }, 0, maxCtxCheckpoints)},
	{key: OptCheckpointMinStep, def: "8192", doc: "least tokens between a slot's checkpoints (llama-server's --checkpoint-min-step)",
		parse: intField(func(o *Options) *int { return &o.CheckpointMinStep }, 0, maxNCtx)},
	{key: OptCheckpointRAM, def: "8192", doc: "host memory in MiB every slot's checkpoints share, the oldest dropped first; -1 no byte limit",
		parse: func(o *Options, key, v string) error {
			n, err := iface.ParseIntOption(key, v, -1, maxCacheRAM)
			o.CheckpointRAM = int64(n)
			return err
		}},
}

// Budget is the checkpoints' budget in bytes (-1: none).
func (o CkptOptions) Budget() int64 {
	if o.CheckpointRAM < 0 {
		return -1
	}
	return o.CheckpointRAM << 20
}

// Text describes the options for the load log.
func (o CkptOptions) Text() string {
	if o.CtxCheckpoints == 0 {
		return "off"
	}
	ram := "no byte limit"
	if o.CheckpointRAM >= 0 {
		ram = fmt.Sprintf("%d MiB", o.CheckpointRAM)
	}
	return fmt.Sprintf("%d a slot, %d tokens apart, %s", o.CtxCheckpoints, o.CheckpointMinStep, ram)
}
