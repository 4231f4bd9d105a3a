package bridge

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// TestReplayFrames reads replay answers in both framings. The topic-frame
// messages are the shape testdata/llmd-sim recorded from
// llm-d-inference-sim (TestRecordedReplayFramesReproduced checks the
// engine simulator sends those bytes); the others vLLM's at 0181ea31.
func TestReplayFrames(t *testing.T) {
	seq := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	topic := []byte("kv@127.0.0.1:18001@sim-model")
	payload := []byte{0x93, 0xcb}
	for _, tc := range []struct {
		name    string
		frames  [][]byte
		topic   []byte
		seq     uint64
		payload []byte
		bad     bool
	}{
		{name: "vllm_batch", frames: [][]byte{{}, seq(7), payload}, seq: 7, payload: payload},
		{name: "vllm_end", frames: [][]byte{{}, seq(endSeq), {}}, seq: endSeq, payload: []byte{}},
		{name: "sim_batch", frames: [][]byte{{}, topic, seq(1), payload}, topic: topic, seq: 1, payload: payload},
		{name: "sim_end", frames: [][]byte{{}, {}, seq(endSeq), {}}, topic: topic, seq: endSeq, payload: []byte{}},
		{name: "topic_frame_any_topic_in_dial_mode", frames: [][]byte{{}, []byte("other"), seq(3), payload}, seq: 3, payload: payload},
		{name: "another_pods_topic", frames: [][]byte{{}, []byte("kv@10.0.0.9:8000@m"), seq(3), payload}, topic: topic, bad: true},
		{name: "no_delimiter", frames: [][]byte{seq(3), payload}, bad: true},
		{name: "short_seq", frames: [][]byte{{}, topic, {1, 2}, payload}, bad: true},
		{name: "delimiter_not_empty", frames: [][]byte{{0}, seq(3), payload}, bad: true},
		{name: "five_frames", frames: [][]byte{{}, topic, seq(3), payload, payload}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, p, err := replayFrames(tc.frames, tc.topic)
			if tc.bad {
				if err == nil {
					t.Errorf("replayFrames = seq %d, nil error; want an error", s)
				}
				return
			}
			if err != nil || s != tc.seq || !bytes.Equal(p, tc.payload) {
				t.Errorf("replayFrames = %d, %x, %v; want %d, %x, nil", s, p, err, tc.seq, tc.payload)
			}
		})
	}
}
