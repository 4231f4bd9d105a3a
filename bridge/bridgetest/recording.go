package bridgetest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Recording is a capture of an engine's ZMQ traffic, as kept in
// testdata/llmd-sim (see its README): every PUB message the engine sent,
// in order, with the connection it came on; every replay answer message;
// notes on what was done to the engine; and the expected index, the
// blocks resident after each batch as an independent msgpack decoder read
// them.
type Recording struct {
	// Name is the file's base name without "-frames.jsonl".
	Name string
	// Lines are the capture's lines in order.
	Lines []RecordedLine
	// Topic is the ZMQ topic of the engine's PUB messages.
	Topic string
	// ResidentAfter maps a batch seq to the engine hashes resident after
	// it (16 lowercase hex digits, sorted).
	ResidentAfter map[uint64][]string
}

// RecordedLine is one line of a capture.
type RecordedLine struct {
	// Kind is "pub" (a PUB message), "replay" (a replay answer message) or
	// "note" (a connection came or went, or what the script did next).
	Kind string
	// Conn numbers the PUB connection, from 1 (pub lines, connection
	// notes).
	Conn int
	// From is the seq the replay request asked from (replay lines).
	From uint64
	// Frames are the message's frames.
	Frames [][]byte
	// Note is the note's text.
	Note string
}

// RecordedBatch is one PUB message of a capture.
type RecordedBatch struct {
	Conn    int
	Topic   string
	Seq     uint64
	Payload []byte
}

// LoadRecording reads dir/name-frames.jsonl and dir/name-expected.json.
func LoadRecording(dir, name string) (*Recording, error) {
	r := &Recording{Name: name}
	f, err := os.Open(filepath.Join(dir, name+"-frames.jsonl"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for n := 1; sc.Scan(); n++ {
		var raw struct {
			Kind   string   `json:"kind"`
			Conn   int      `json:"conn"`
			From   *uint64  `json:"from"`
			Frames []string `json:"frames"`
			Note   string   `json:"note"`
		}
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", name, n, err)
		}
		l := RecordedLine{Kind: raw.Kind, Conn: raw.Conn, Note: raw.Note}
		if raw.From != nil {
			l.From = *raw.From
		}
		for _, h := range raw.Frames {
			b, err := hex.DecodeString(h)
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", name, n, err)
			}
			l.Frames = append(l.Frames, b)
		}
		if l.Kind == "pub" && (len(l.Frames) != 3 || len(l.Frames[1]) != 8) {
			return nil, fmt.Errorf("%s line %d: a pub message of %d frames", name, n, len(l.Frames))
		}
		r.Lines = append(r.Lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, name+"-expected.json"))
	if err != nil {
		return nil, err
	}
	var exp struct {
		Topic            string              `json:"topic"`
		Batches          int                 `json:"batches"`
		ResidentAfterSeq map[string][]string `json:"resident_after_seq"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&exp); err != nil {
		return nil, fmt.Errorf("%s-expected.json: %w", name, err)
	}
	r.Topic = exp.Topic
	if n := len(r.Batches()); n != exp.Batches {
		return nil, fmt.Errorf("%s: %d PUB messages, the expected index counts %d", name, n, exp.Batches)
	}
	r.ResidentAfter = map[uint64][]string{}
	for k, v := range exp.ResidentAfterSeq {
		seq, err := strconv.ParseUint(k, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s-expected.json: seq %q: %w", name, k, err)
		}
		r.ResidentAfter[seq] = v
	}
	return r, nil
}

// Batches returns the capture's PUB messages in order.
func (r *Recording) Batches() []RecordedBatch {
	var out []RecordedBatch
	for _, l := range r.Lines {
		if l.Kind == "pub" {
			out = append(out, RecordedBatch{Conn: l.Conn, Topic: string(l.Frames[0]), Seq: binary.BigEndian.Uint64(l.Frames[1]), Payload: l.Frames[2]})
		}
	}
	return out
}

// RecordedReplay is one replay request of a capture and its answer.
type RecordedReplay struct {
	// From is the seq asked from.
	From uint64
	// Messages are the answer's messages, the end marker last.
	Messages [][][]byte
}

// ReplayAnswers returns the capture's complete replay answers, in order.
func (r *Recording) ReplayAnswers() []RecordedReplay {
	var out []RecordedReplay
	var cur [][][]byte
	for _, l := range r.Lines {
		if l.Kind != "replay" {
			continue
		}
		cur = append(cur, l.Frames)
		if n := len(l.Frames); n >= 2 && len(l.Frames[n-2]) == 8 && binary.BigEndian.Uint64(l.Frames[n-2]) == ^uint64(0) {
			out = append(out, RecordedReplay{From: l.From, Messages: cur})
			cur = nil
		}
	}
	return out
}
