package bridge

import (
	"github.com/kvindex/kvindex/internal/contract"

	"log/slog"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
)

// stream is one endpoint the bridge produces for: its identity in the
// records (pod, model, rank), its replay socket, and the hooks the
// sequencer calls. The dial mode has one stream, built from Config.Pod,
// Model, DPRank and ReplayEndpoint; the bind mode one per topic a
// publisher sends (bind.go).
type stream struct {
	key, model, rank []byte
	dpRank           uint32
	// replayAddr is the host:port of the endpoint's replay socket, "" for
	// none.
	replayAddr string
	// replayTopic, when set, is the topic a replay answer that carries a
	// topic frame must carry (bind mode: the pod's own); nil accepts any.
	replayTopic []byte
	log         *slog.Logger
	// drop forces the stream's PUB connection to be replaced (the engine
	// was found replaced under it).
	drop func()
	// state reports the stream's connection state to the mode that owns
	// it: connected, and caught up after connecting.
	state func(connected, caughtUp bool)
}

func newStream(pod, model string, rank uint32, replayAddr string, log *slog.Logger) *stream {
	return &stream{
		key:        []byte(pod),
		model:      []byte(model),
		rank:       []byte(strconv.FormatUint(uint64(rank), 10)),
		dpRank:     rank,
		replayAddr: replayAddr,
		log:        log,
		drop:       func() {},
		state:      func(bool, bool) {},
	}
}

// batchRecord is the record of one engine batch: key = pod, value = the
// payload exactly as received (not copied), headers model, seq, dp_rank.
func (st *stream) batchRecord(seq uint64, payload []byte) *kgo.Record {
	return &kgo.Record{
		Key:   st.key,
		Value: payload,
		Headers: []kgo.RecordHeader{
			{Key: contract.HeaderModel, Value: st.model},
			{Key: contract.HeaderSeq, Value: strconv.AppendUint(nil, seq, 10)},
			{Key: contract.HeaderDPRank, Value: st.rank},
		},
	}
}

// controlRecord is a kind record: no value, headers model, dp_rank, kind.
func (st *stream) controlRecord(kind string) *kgo.Record {
	return &kgo.Record{
		Key: st.key,
		Headers: []kgo.RecordHeader{
			{Key: contract.HeaderModel, Value: st.model},
			{Key: contract.HeaderDPRank, Value: st.rank},
			{Key: contract.HeaderKind, Value: []byte(kind)},
		},
	}
}
