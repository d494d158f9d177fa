package httpapi

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hydra-engine/hydra-engine/host"
)

// Metric names. The transfer histograms carry a "direction" label (get, put)
// and seconds buckets fine enough to sit beside the coordinator's
// hydra_save_kv_rpc_seconds on one dashboard. GET counts every state the
// engine streams out: STATE_GET and the blob of a PREFILL reply.
const (
	metricRequests        = "hydra_engine_requests_total"
	metricRequestSeconds  = "hydra_engine_request_seconds_total"
	metricTransferSeconds = "hydra_engine_state_transfer_seconds"
	metricTransferBytes   = "hydra_engine_state_transfer_bytes"
	metricTransferFailed  = "hydra_engine_state_transfer_failures_total"
	metricTransferWait    = "hydra_engine_state_transfer_backend_wait_seconds_total"
	metricPathTransfers   = "hydra_engine_state_transfer_path_transfers_total"
	metricPathBytes       = "hydra_engine_state_transfer_path_bytes_total"
	metricPathSeconds     = "hydra_engine_state_transfer_path_seconds_total"
	metricChunkSize       = "hydra_engine_state_chunk_size_bytes"
	metricRestarts        = "hydra_engine_plugin_restarts_total"
	metricSlots           = "hydra_engine_slots"
	metricSlotsBusy       = "hydra_engine_slots_busy"
	metricTokens          = "hydra_engine_tokens_total"
	metricTokenSeconds    = "hydra_engine_token_seconds_total"
	metricTokensPerSecond = "hydra_engine_tokens_per_second"
	metricInfo            = "hydra_engine_info"
	metricHTTPRequests    = "hydra_engine_http_requests_total"
	metricConnsOpen       = "hydra_engine_rpc_connections"
	metricConnsRefused    = "hydra_engine_rpc_connections_refused_total"
	metricAcceptErrors    = "hydra_engine_rpc_accept_errors_total"
	metricBudgetInUse     = "hydra_engine_payload_budget_in_use_bytes"
	metricBudgetSize      = "hydra_engine_payload_budget_bytes"
	metricEvictions       = "hydra_engine_slot_evictions_total"
	metricKVEvictions     = "hydra_engine_kv_evictions_total"
	metricKVEvictedCells  = "hydra_engine_kv_evicted_cells_total"
	metricReused          = "hydra_engine_prompt_tokens_reused_total"
	metricDraftTokens     = "hydra_engine_draft_tokens_total"
	metricDraftAccepted   = "hydra_engine_draft_tokens_accepted_total"
	metricQueue           = "hydra_engine_http_queue_waiting"
	metricQueueSeconds    = "hydra_engine_http_queue_seconds"
	metricTTFT            = "hydra_engine_time_to_first_token_seconds"
	metricInterToken      = "hydra_engine_inter_token_latency_seconds"
)

// metrics is the engine's Prometheus side, on a registry of its own (no
// global state, so tests and several servers in one process do not clash).
// Counters and gauges are read from the server's Stats, slots and tunables at
// scrape time; histograms are fed per event as its host.StatsObserver.
type metrics struct {
	s   *host.Server
	reg *prometheus.Registry

	transferSeconds *prometheus.HistogramVec
	transferBytes   *prometheus.HistogramVec
	tokensPerSecond *prometheus.HistogramVec
	httpRequests    *prometheus.CounterVec
	// HTTP completions' latencies, by model alias (observed by completion.go).
	queueSeconds, ttft, interToken *prometheus.HistogramVec

	requests, requestSeconds, transferFailed, transferWait, chunkSize, restarts *prometheus.Desc
	pathTransfers, pathBytes, pathSeconds                                       *prometheus.Desc
	slots, slotsBusy, tokens, tokenSeconds, info                                *prometheus.Desc
	connsOpen, connsRefused, acceptErrors, budgetInUse, budgetSize              *prometheus.Desc
	evictions, reused, queue                                                    *prometheus.Desc
	kvEvictions, kvEvictedCells                                                 *prometheus.Desc
	draftTokens, draftAccepted                                                  *prometheus.Desc
	queueLen                                                                    func() int
	llama                                                                       llamaCompat
	cache                                                                       promptCacheDescs
	ckpt                                                                        checkpointDescs
	combined                                                                    combinedDescs
	spec                                                                        specDescs
}

// llamaCompat are llama-server's metrics where one of ours means the same,
// under its names, so dashboards written for llama-server keep working.
type llamaCompat struct {
	promptTokens, promptSeconds, predicted, predictedSeconds *prometheus.Desc
	promptRate, predictedRate, processing, deferred          *prometheus.Desc
	kvTokens, kvUsage                                        *prometheus.Desc
}

func newLlamaCompat() llamaCompat {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc("llamacpp:"+name, help, nil, nil) }
	return llamaCompat{
		promptTokens:     d("prompt_tokens_total", "Number of prompt tokens processed."),
		promptSeconds:    d("prompt_seconds_total", "Prompt process time."),
		predicted:        d("tokens_predicted_total", "Number of generation tokens processed."),
		predictedSeconds: d("tokens_predicted_seconds_total", "Predict process time."),
		promptRate:       d("prompt_tokens_seconds", "Average prompt throughput in tokens/s."),
		predictedRate:    d("predicted_tokens_seconds", "Average generation throughput in tokens/s."),
		processing:       d("requests_processing", "Number of requests processing."),
		deferred:         d("requests_deferred", "Number of requests deferred."),
		kvTokens:         d("kv_cache_tokens", "KV-cache tokens."),
		kvUsage:          d("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage."),
	}
}

func (l llamaCompat) descs() []*prometheus.Desc {
	return []*prometheus.Desc{l.promptTokens, l.promptSeconds, l.predicted, l.predictedSeconds, l.promptRate,
		l.predictedRate, l.processing, l.deferred, l.kvTokens, l.kvUsage}
}

func newMetrics(s *host.Server) *metrics {
	m := &metrics{
		s:   s,
		reg: prometheus.NewRegistry(),
		transferSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricTransferSeconds,
			Help:    "Duration of completed state transfers (get: STATE_GET and PREFILL blobs, put: STATE_PUT).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60, 120, 300},
		}, []string{"direction"}),
		transferBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricTransferBytes,
			Help:    "Payload bytes of completed state transfers.",
			Buckets: prometheus.ExponentialBuckets(64<<10, 4, 9), // 64 KiB … 4 GiB
		}, []string{"direction"}),
		tokensPerSecond: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricTokensPerSecond,
			Help:    "Throughput of each prefill or decode, in tokens per second.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 20), // 1 … 524288
		}, []string{"phase"}),
		queueSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricQueueSeconds,
			Help:    "Time HTTP completions waited for a slot (0 when one was free), by model alias.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricTTFT,
			Help:    "Time from an HTTP completion's arrival to its first generated token (queue and prefill included), by model alias.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, .75, 1, 2.5, 5, 10, 20, 40, 80},
		}, []string{"model"}),
		interToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricInterToken,
			Help:    "Time between two consecutive generated tokens of an HTTP completion, by model alias.",
			Buckets: []float64{.001, .0025, .005, .0075, .01, .015, .02, .03, .05, .075, .1, .2, .5, 1, 2.5},
		}, []string{"model"}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricHTTPRequests,
			Help: "HTTP requests by route and status code.",
		}, []string{"handler", "code"}),
		requests: prometheus.NewDesc(metricRequests,
			"Hydra RPC requests by op and reply status (ABORTED: the connection was cut mid-request).",
			[]string{"op", "status"}, nil),
		requestSeconds: prometheus.NewDesc(metricRequestSeconds,
			"Time spent serving Hydra RPC requests, by op and reply status.", []string{"op", "status"}, nil),
		transferFailed: prometheus.NewDesc(metricTransferFailed,
			"State transfers that failed.", []string{"direction"}, nil),
		pathTransfers: prometheus.NewDesc(metricPathTransfers,
			"Completed state transfers by direction and the path their bytes took between the host and the backend "+
				"(shm-ring, shm-ring-relay, shm-pipes, grpc).", []string{"direction", "path"}, nil),
		pathBytes: prometheus.NewDesc(metricPathBytes,
			"Payload bytes of those transfers; rate(bytes) / rate(seconds) is their GB/s by path.", []string{"direction", "path"}, nil),
		pathSeconds: prometheus.NewDesc(metricPathSeconds,
			"Time those transfers took.", []string{"direction", "path"}, nil),
		transferWait: prometheus.NewDesc(metricTransferWait,
			"Time completed state transfers spent waiting on the backend plugin (shm data plane); the rest of "+
				metricTransferSeconds+"_sum is socket work or waiting on the client.", []string{"direction"}, nil),
		chunkSize: prometheus.NewDesc(metricChunkSize,
			"state_chunk_size the next state transfer uses (CONFIGURE).", nil, nil),
		restarts: prometheus.NewDesc(metricRestarts,
			"Relaunches of the backend plugin.", nil, nil),
		slots: prometheus.NewDesc(metricSlots,
			"Slots (sequences) of the backend.", nil, nil),
		slotsBusy: prometheus.NewDesc(metricSlotsBusy,
			"Slots held by an operation (processing or transferring).", nil, nil),
		tokens: prometheus.NewDesc(metricTokens,
			"Tokens prefilled or decoded; divide its rate by hydra_engine_token_seconds_total's for tokens per second.",
			[]string{"phase"}, nil),
		tokenSeconds: prometheus.NewDesc(metricTokenSeconds,
			"Time spent prefilling or decoding.", []string{"phase"}, nil),
		info: prometheus.NewDesc(metricInfo,
			"The engine's version, backend and resident model (value 1).",
			[]string{"version", "backend", "backend_version", "model_alias", "model_hash"}, nil),
		connsOpen: prometheus.NewDesc(metricConnsOpen,
			"Hydra RPC connections being served, over all listeners.", nil, nil),
		connsRefused: prometheus.NewDesc(metricConnsRefused,
			"Hydra RPC connections refused because their listener was at max_conns.", nil, nil),
		acceptErrors: prometheus.NewDesc(metricAcceptErrors,
			"Failed accepts on the Hydra RPC listeners (e.g. out of file descriptors), each retried with backoff.", nil, nil),
		budgetInUse: prometheus.NewDesc(metricBudgetInUse,
			"Bytes of the payload budget taken by request payloads being read into memory (RPC and HTTP).", nil, nil),
		budgetSize: prometheus.NewDesc(metricBudgetSize,
			"The payload budget (payload_budget).", nil, nil),
		evictions: prometheus.NewDesc(metricEvictions,
			"HTTP completions that took a slot holding a sequence, by who put it there (http: an earlier completion's, "+
				"when no free slot was empty or shared the prompt; rpc: only completions naming the slot with id_slot).",
			[]string{"holder"}, nil),
		kvEvictions: prometheus.NewDesc(metricKVEvictions,
			"Idle sequences of HTTP completions evicted, least recently used first, to make room for a prompt in the KV cache the slots share.", nil, nil),
		kvEvictedCells: prometheus.NewDesc(metricKVEvictedCells,
			"KV cells those evictions freed.", nil, nil),
		reused: prometheus.NewDesc(metricReused,
			"Prompt tokens a prefill kept from the slot's previous sequence instead of evaluating them.", nil, nil),
		draftTokens: prometheus.NewDesc(metricDraftTokens,
			"Speculative decoding's draft tokens the target model verified (llama-server's draft_n, summed).", nil, nil),
		draftAccepted: prometheus.NewDesc(metricDraftAccepted,
			"Of those, the draft tokens accepted (draft_n_accepted).", nil, nil),
		queue: prometheus.NewDesc(metricQueue,
			"HTTP completions waiting for a slot.", nil, nil),
		llama:    newLlamaCompat(),
		cache:    newPromptCacheDescs(),
		ckpt:     newCheckpointDescs(),
		combined: newCombinedDescs(),
		spec:     newSpecDescs(),
	}
	m.reg.MustRegister(m, m.transferSeconds, m.transferBytes, m.tokensPerSecond, m.httpRequests, m.queueSeconds, m.ttft, m.interToken,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// handler serves the registry in the Prometheus text (or OpenMetrics) format.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, EnableOpenMetrics: true})
}

// direction is a transfer's "direction" label.
func direction(put bool) string {
	if put {
		return "put"
	}
	return "get"
}

// Transfer observes a completed transfer; failures are counted by Stats.
func (m *metrics) Transfer(put bool, _ string, bytes int64, d time.Duration, err error) {
	if err != nil {
		return
	}
	dir := direction(put)
	m.transferSeconds.WithLabelValues(dir).Observe(d.Seconds())
	m.transferBytes.WithLabelValues(dir).Observe(float64(bytes))
}

// Tokens observes one prefill or decode.
func (m *metrics) Tokens(phase string, n int, d time.Duration) {
	m.tokensPerSecond.WithLabelValues(phase).Observe(float64(n) / d.Seconds())
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.requests, m.requestSeconds, m.transferFailed, m.transferWait, m.chunkSize,
		m.pathTransfers, m.pathBytes, m.pathSeconds,
		m.restarts, m.slots, m.slotsBusy, m.tokens, m.tokenSeconds, m.info,
		m.connsOpen, m.connsRefused, m.acceptErrors, m.budgetInUse, m.budgetSize, m.evictions, m.reused, m.queue,
		m.kvEvictions, m.kvEvictedCells, m.draftTokens, m.draftAccepted} {
		ch <- d
	}
	for _, d := range m.llama.descs() {
		ch <- d
	}
	for _, d := range m.cache.descs() {
		ch <- d
	}
	for _, d := range m.ckpt.descs() {
		ch <- d
	}
	for _, d := range m.spec.descs() {
		ch <- d
	}
	for _, d := range m.combined.descs() {
		ch <- d
	}
}

// Collect reads the running totals at scrape time.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.collectRequests(ch)
	m.collectTransfers(ch)
	s := m.s
	ch <- prometheus.MustNewConstMetric(m.chunkSize, prometheus.GaugeValue, float64(s.Tunables().StateChunkSize()))
	ch <- prometheus.MustNewConstMetric(m.restarts, prometheus.CounterValue, float64(s.Stats().PluginRestarts()))
	slots, busy := s.Slots(), 0
	for _, v := range slots {
		if v.Processing || v.Transferring {
			busy++
		}
	}
	ch <- prometheus.MustNewConstMetric(m.slots, prometheus.GaugeValue, float64(len(slots)))
	ch <- prometheus.MustNewConstMetric(m.slotsBusy, prometheus.GaugeValue, float64(busy))
	prefill, decode := s.Stats().Tokens()
	for phase, t := range map[string]host.TokenStats{host.PhasePrefill: prefill, host.PhaseDecode: decode} {
		ch <- prometheus.MustNewConstMetric(m.tokens, prometheus.CounterValue, float64(t.Tokens), phase)
		ch <- prometheus.MustNewConstMetric(m.tokenSeconds, prometheus.CounterValue, t.Seconds, phase)
	}
	m.collectLimits(ch)
	m.collectLlama(ch, prefill, decode, busy)
	m.collectBackend(ch)
	m.collectCombined(ch)
	_, info := s.Backend()
	ch <- prometheus.MustNewConstMetric(m.info, prometheus.GaugeValue, 1,
		s.Config().Version, info.Name, info.Version, info.Model.Alias, info.Model.Hash)
}

// collectLlama writes llama-server's metrics from the token counters, the
// slots busy and the KV cells the slots hold.
func (m *metrics) collectLlama(ch chan<- prometheus.Metric, prefill, decode host.TokenStats, busy int) {
	l := m.llama
	rate := func(t host.TokenStats) float64 {
		if t.Seconds <= 0 {
			return 0
		}
		return float64(t.Tokens) / t.Seconds
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter(l.promptTokens, float64(prefill.Tokens))
	counter(l.promptSeconds, prefill.Seconds)
	counter(l.predicted, float64(decode.Tokens))
	counter(l.predictedSeconds, decode.Seconds)
	gauge(l.promptRate, rate(prefill))
	gauge(l.predictedRate, rate(decode))
	gauge(l.processing, float64(busy))
	queued := 0
	if m.queueLen != nil {
		queued = m.queueLen()
	}
	gauge(l.deferred, float64(queued))
	_, info := m.s.Backend()
	used := 0
	for _, v := range m.s.Slots() {
		used += v.NPast
	}
	gauge(l.kvTokens, float64(used))
	if info.NCtx > 0 {
		gauge(l.kvUsage, float64(used)/float64(info.NCtx))
	} else {
		gauge(l.kvUsage, 0)
	}
}

// collectLimits reads the connection counters and the payload budget.
func (m *metrics) collectLimits(ch chan<- prometheus.Metric) {
	c := m.s.Stats().Connections()
	ch <- prometheus.MustNewConstMetric(m.connsOpen, prometheus.GaugeValue, float64(c.Open))
	ch <- prometheus.MustNewConstMetric(m.connsRefused, prometheus.CounterValue, float64(c.Refused))
	ch <- prometheus.MustNewConstMetric(m.acceptErrors, prometheus.CounterValue, float64(c.AcceptErrors))
	ch <- prometheus.MustNewConstMetric(m.budgetInUse, prometheus.GaugeValue, float64(m.s.PayloadBudgetInUse()))
	ch <- prometheus.MustNewConstMetric(m.budgetSize, prometheus.GaugeValue, float64(m.s.PayloadBudgetSize()))
	ev := m.s.Stats().SlotEvictions()
	for _, h := range []host.SlotHolder{host.HolderHTTP, host.HolderRPC} {
		ch <- prometheus.MustNewConstMetric(m.evictions, prometheus.CounterValue, float64(ev[h]), h.String())
	}
	seqs, cells := m.s.Stats().KVEvictions()
	ch <- prometheus.MustNewConstMetric(m.kvEvictions, prometheus.CounterValue, float64(seqs))
	ch <- prometheus.MustNewConstMetric(m.kvEvictedCells, prometheus.CounterValue, float64(cells))
	ch <- prometheus.MustNewConstMetric(m.reused, prometheus.CounterValue, float64(m.s.Stats().PromptTokensReused()))
	drafted, accepted := m.s.Stats().Drafts()
	ch <- prometheus.MustNewConstMetric(m.draftTokens, prometheus.CounterValue, float64(drafted))
	ch <- prometheus.MustNewConstMetric(m.draftAccepted, prometheus.CounterValue, float64(accepted))
	if m.queueLen != nil {
		ch <- prometheus.MustNewConstMetric(m.queue, prometheus.GaugeValue, float64(m.queueLen()))
	}
}

// collectRequests reads the Hydra RPC request counters.
func (m *metrics) collectRequests(ch chan<- prometheus.Metric) {
	for k, v := range m.s.Stats().Requests() {
		st := k.Status.String()
		if k.Aborted {
			st = "ABORTED"
		}
		op := k.Op.String()
		ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue, float64(v.Count), op, st)
		ch <- prometheus.MustNewConstMetric(m.requestSeconds, prometheus.CounterValue, v.Seconds, op, st)
	}
}

// collectTransfers reads the state transfer counters.
func (m *metrics) collectTransfers(ch chan<- prometheus.Metric) {
	get, put := m.s.Stats().Transfers()
	for dir, t := range map[string]host.TransferStats{"get": get, "put": put} {
		ch <- prometheus.MustNewConstMetric(m.transferFailed, prometheus.CounterValue, float64(t.Failed), dir)
		ch <- prometheus.MustNewConstMetric(m.transferWait, prometheus.CounterValue, t.BackendWait, dir)
	}
	for k, t := range m.s.Stats().TransfersByPath() {
		dir := direction(k.Put)
		ch <- prometheus.MustNewConstMetric(m.pathTransfers, prometheus.CounterValue, float64(t.Count), dir, k.Path)
		ch <- prometheus.MustNewConstMetric(m.pathBytes, prometheus.CounterValue, float64(t.Bytes), dir, k.Path)
		ch <- prometheus.MustNewConstMetric(m.pathSeconds, prometheus.CounterValue, t.Seconds, dir, k.Path)
	}
}

var _ host.StatsObserver = (*metrics)(nil)
