package bridgecmd

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no_pod", []string{"--model", "m"}, "--pod: keyspace: invalid name: empty pod"},
		{"no_model", []string{"--pod", "p"}, "--model: keyspace: invalid name: empty model"},
		{"bind_address", []string{"--pod", "p", "--model", "m", "--zmq", "tcp://*:5557"}, "bind address"},
		{"offset_past_last_port", []string{"--pod", "p", "--model", "m", "--zmq", "tcp://e:65535", "--dp-rank", "1"}, "--zmq"},
		{"bad_log_level", []string{"--pod", "p", "--model", "m", "--log-level", "loud"}, "level"},
		{"positional_args", []string{"--pod", "p", "--model", "m", "extra"}, "unknown command"},
		{"etcd_flag", []string{"--pod", "p", "--model", "m", "--etcd-endpoints", "http://e:2379"}, "unknown flag: --etcd-endpoints"},
		{"bad_topic", []string{"--pod", "p", "--model", "m", "--topic", "bad topic/x"}, "--topic: topic name"},
		{"bind_with_zmq", []string{"--zmq-bind", "tcp://*:5557", "--zmq", "tcp://e:5557"}, "dial mode"},
		{"bind_bad_pattern", []string{"--listen", "tcp://*:5557", "--topic-pattern", "kv@{model}"}, "{pod}"},
		{"bind_bad_replay_pattern", []string{"--zmq-bind", "tcp://*:5557", "--replay-pattern", "tcp://{host}"}, "--replay-pattern: "},
		{"zero_max_connections", []string{"--zmq-bind", "tcp://*:5557", "--max-connections", "0"}, "--max-connections must be positive, got 0"},
		{"zero_heartbeat", []string{"--pod", "p", "--model", "m", "--heartbeat-interval", "0s"}, "--heartbeat-interval must be positive, got 0s"},
		{"negative_grace", []string{"--pod", "p", "--model", "m", "--grace-period", "-1s"}, "--grace-period must be zero or positive, got -1s"},
		// The endpoints' errors name their flags (before: Endpoint,
		// ReplayEndpoint, Listen), --listen's its primary's.
		{"bad_zmq", []string{"--pod", "p", "--model", "m", "--zmq", "bogus"}, `--zmq: "bogus": want tcp://HOST:PORT`},
		{"bad_replay", []string{"--pod", "p", "--model", "m", "--replay", "bogus"}, `--replay: "bogus": want tcp://HOST:PORT`},
		{"bad_zmq_bind", []string{"--zmq-bind", "bogus"}, `--zmq-bind: "bogus": want tcp://HOST:PORT`},
		{"bad_listen", []string{"--listen", "bogus"}, `--zmq-bind: "bogus": want tcp://HOST:PORT`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := NewCommand()
			cmd.SetArgs(append(tc.args, "--metrics-listen", "127.0.0.1:0"))
			cmd.SetOut(new(strings.Builder))
			cmd.SetErr(new(strings.Builder))
			err := cmd.ExecuteContext(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(20*time.Second))
	defer cancel()
	eng, err := enginesim.New(enginesim.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	k := testutil.StartKafka(t, "events", 2)
	payload := enginesim.Batch{TS: 1.7e9, Events: []enginesim.Event{enginesim.AllBlocksCleared{}}}.MustEncode()
	// Published before the bridge starts: its catch-up replay delivers it.
	if _, err := eng.Publish(ctx, payload); err != nil {
		t.Fatal(err)
	}
	consumer := bridgetest.NewConsumer(t, k.Brokers, "events")

	runCtx, stop := context.WithCancel(ctx)
	cmd := NewCommand()
	cmd.SetArgs([]string{
		"--zmq", eng.PubEndpoint(), "--replay", eng.ReplayEndpoint(), "--offset-by-rank=false",
		"--brokers", strings.Join(k.Brokers, ","), "--topic", "events",
		"--pod", "ns/vllm-1", "--model", "m", "--dp-rank", "1",
		"--metrics-listen", "127.0.0.1:0", "--grace-period", "0", "--log-level", "error",
	})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(runCtx) }()
	got, err := consumer.Read(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	got[0].Partition = 0
	if d := cmp.Diff([]bridgetest.Record{bridgetest.BatchRecord("ns/vllm-1", "m", 1, 0, payload)}, got); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("bridge command after SIGTERM = %v, want nil", err)
	}
}

func TestRunBind(t *testing.T) {
	// --zmq-bind: a pod connects as llm-d's pods do, and its topic names
	// the record's key and model.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(20*time.Second))
	defer cancel()
	k := testutil.StartKafka(t, "events", 2)
	consumer := bridgetest.NewConsumer(t, k.Brokers, "events")
	runCtx, stop := context.WithCancel(ctx)
	cmd := NewCommand()
	cmd.SetArgs([]string{
		"--zmq-bind", "tcp://127.0.0.1:0", "--brokers", strings.Join(k.Brokers, ","), "--topic", "events",
		"--metrics-listen", "127.0.0.1:0", "--log-level", "info",
	})
	var out testutil.SyncBuffer
	cmd.SetErr(&out)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(runCtx) }()
	// The bound address, read back from the bridge's log line.
	addr := out.WaitMatch(t, regexp.MustCompile(`listening for publishers.*addr=tcp://(\S+)`), 20*time.Second)
	cfg := enginesim.DefaultConfig()
	cfg.Connect, cfg.Topic, cfg.ReplayAddr, cfg.FirstSeq = addr, "kv@10.0.0.7:8000@org/m", "", 1
	eng, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if err := eng.WaitSubscriptions(ctx, 1); err != nil {
		t.Fatal(err)
	}
	payload := enginesim.Batch{TS: 1.7e9, Events: []enginesim.Event{enginesim.AllBlocksCleared{}}}.MustEncode()
	if _, err := eng.Publish(ctx, payload); err != nil {
		t.Fatal(err)
	}
	got, err := consumer.Read(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	got[0].Partition = 0
	if d := cmp.Diff([]bridgetest.Record{bridgetest.BatchRecord("10.0.0.7:8000", "org/m", 0, 1, payload)}, got); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("bridge command after SIGTERM = %v, want nil", err)
	}
}

// TestKafkaAndLimitFlagsAreUsageErrors: every bad value of --brokers,
// --topic and --max-message-bytes is refused before the bridge starts,
// naming the flag, as a usage error (exit status 2). Before, `--brokers
// ','` (two empty entries after splitting) passed, `--brokers ”` and
// `--topic ”` exited 1 while every other bad flag exits 2, and
// `--max-message-bytes 9223372036854775807` was accepted, letting one
// frame header claiming 2^61 bytes reach zmq4's make() and crash the
// process.
func TestKafkaAndLimitFlagsAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"brokers_only_commas", []string{"--brokers", ","}, "--brokers has an empty entry"},
		{"brokers_empty_entry", []string{"--brokers", "k:9092,"}, "--brokers has an empty entry"},
		{"brokers_empty", []string{"--brokers", ""}, "--brokers must name at least one"},
		{"brokers_credentials", []string{"--brokers", "u:pw@k:9092"}, "--brokers: "},
		{"topic_empty", []string{"--topic", ""}, "--topic: "},
		{"max_message_bytes_huge", []string{"--max-message-bytes", "9223372036854775807"}, "--max-message-bytes 9223372036854775807: want at most"},
		{"max_message_bytes_over_cap", []string{"--max-message-bytes", "1073741825"}, "--max-message-bytes 1073741825: want at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := NewCommand()
			cmd.SetArgs(append([]string{"--pod", "p", "--model", "m", "--metrics-listen", "127.0.0.1:0"}, tc.args...))
			cmd.SetOut(new(strings.Builder))
			cmd.SetErr(new(strings.Builder))
			err := cmd.ExecuteContext(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one mentioning %q", err, tc.want)
			}
			var coded interface{ ExitCode() int }
			if !errors.As(err, &coded) || coded.ExitCode() != 2 || !errors.Is(err, common.ErrUsage) {
				t.Errorf("error %q is not a usage error (exit status 2)", err)
			}
		})
	}
}

// TestBindModeRefusesDialFlags: --zmq, --replay and --pod are the dial
// mode's; with --zmq-bind they are usage errors naming the mode (--pod was
// ignored before, so a bridge looked keyed by a pod it never used).
func TestBindModeRefusesDialFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pod", "p"}, "--pod is the dial mode's"},
		{[]string{"--zmq", "tcp://e:5557"}, "--zmq and --replay are the dial mode's"},
		{[]string{"--replay", "tcp://e:5558"}, "--zmq and --replay are the dial mode's"},
	} {
		cmd := NewCommand()
		cmd.SetArgs(append([]string{"--zmq-bind", "tcp://127.0.0.1:0", "--model", "m", "--brokers", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:0"}, tc.args...))
		cmd.SetOut(new(strings.Builder))
		cmd.SetErr(new(strings.Builder))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := cmd.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, common.ErrUsage) {
			t.Errorf("%v: error = %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
}
