package deploy

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Strimzi custom resources (kafka.strimzi.io/v1, Strimzi 0.49 and later).
// The CRDs are not vendored: these structs hold the fields of Strimzi's v1
// API reference that the manifests use, decoded strictly, so a misspelt or
// unsupported field fails; checkKafka and checkTopic then enforce the fields that
// reference marks required and the enums of the ones used. A field the
// manifests start to use must be added here, from that reference.

type strimziKafka struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       *struct {
		Kafka *struct {
			Version         string `json:"version,omitempty"`
			MetadataVersion string `json:"metadataVersion,omitempty"`
			Listeners       []struct {
				Name string `json:"name"`
				Port int32  `json:"port"`
				Type string `json:"type"`
				TLS  *bool  `json:"tls"`
			} `json:"listeners"`
			Config map[string]any `json:"config,omitempty"`
		} `json:"kafka"`
		EntityOperator *struct {
			TopicOperator *struct{} `json:"topicOperator,omitempty"`
			UserOperator  *struct{} `json:"userOperator,omitempty"`
		} `json:"entityOperator,omitempty"`
	} `json:"spec"`
}

type strimziNodePool struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       *struct {
		Replicas *int32   `json:"replicas"`
		Roles    []string `json:"roles"`
		Storage  *struct {
			Type    string          `json:"type"`
			Size    string          `json:"size,omitempty"`
			Class   string          `json:"class,omitempty"`
			Volumes []strimziVolume `json:"volumes,omitempty"`
		} `json:"storage"`
		Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	} `json:"spec"`
}

type strimziVolume struct {
	ID            *int32 `json:"id"`
	Type          string `json:"type"`
	Size          string `json:"size,omitempty"`
	Class         string `json:"class,omitempty"`
	DeleteClaim   *bool  `json:"deleteClaim,omitempty"`
	KraftMetadata string `json:"kraftMetadata,omitempty"`
}

type strimziTopic struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       *struct {
		TopicName  string         `json:"topicName,omitempty"`
		Partitions *int32         `json:"partitions,omitempty"`
		Replicas   *int32         `json:"replicas,omitempty"`
		Config     map[string]any `json:"config,omitempty"`
	} `json:"spec"`
}

const strimziClusterLabel = "strimzi.io/cluster"

var listenerName = regexp.MustCompile(`^[a-z0-9]{1,11}$`)

func TestStrimzi(t *testing.T) {
	var checked int
	for _, b := range okBuilds(t) {
		kafkas, pools, topics := typed[strimziKafka](b), typed[strimziNodePool](b), typed[strimziTopic](b)
		if len(kafkas)+len(pools)+len(topics) == 0 {
			continue
		}
		checked++
		t.Run(b.Dir, func(t *testing.T) {
			byName := map[string]*strimziKafka{}
			for _, k := range kafkas {
				byName[k.Metadata.Name] = k
				checkKafka(t, k)
			}
			brokers := map[string]int32{}
			for _, p := range pools {
				where := "KafkaNodePool " + p.Metadata.Name
				cluster := p.Metadata.Labels[strimziClusterLabel]
				if byName[cluster] == nil {
					t.Errorf("%s: label %s=%q names no Kafka in the build", where, strimziClusterLabel, cluster)
				}
				if p.Spec == nil || p.Spec.Replicas == nil || len(p.Spec.Roles) == 0 || p.Spec.Storage == nil {
					t.Errorf("%s: spec.replicas, spec.roles and spec.storage are required", where)
					continue
				}
				for _, r := range p.Spec.Roles {
					if r != "controller" && r != "broker" {
						t.Errorf("%s: role %q is not controller or broker", where, r)
					}
					if r == "broker" {
						brokers[cluster] += *p.Spec.Replicas
					}
				}
				checkStorage(t, where, p.Spec.Storage.Type, p.Spec.Storage.Size, p.Spec.Storage.Volumes)
			}
			for name := range byName {
				if brokers[name] == 0 {
					t.Errorf("Kafka %s: no KafkaNodePool gives it brokers", name)
				}
			}
			for _, tp := range topics {
				checkTopic(t, b, tp, byName, brokers)
			}
		})
	}
	if checked == 0 {
		t.Fatal("no build holds Strimzi resources (overlays/strimzi should)")
	}
}

func checkKafka(t *testing.T, k *strimziKafka) {
	t.Helper()
	where := "Kafka " + k.Metadata.Name
	if k.Spec == nil || k.Spec.Kafka == nil || len(k.Spec.Kafka.Listeners) == 0 {
		t.Errorf("%s: spec.kafka.listeners is required", where)
		return
	}
	for _, l := range k.Spec.Kafka.Listeners {
		if !listenerName.MatchString(l.Name) {
			t.Errorf("%s: listener name %q must match %s", where, l.Name, listenerName)
		}
		if l.Port < 9092 || l.TLS == nil || l.Type == "" {
			t.Errorf("%s: listener %s: port (>= 9092), type and tls are required", where, l.Name)
		}
		switch l.Type {
		case "internal", "cluster-ip", "route", "loadbalancer", "nodeport", "ingress":
		default:
			t.Errorf("%s: listener %s: type %q is not a Strimzi listener type", where, l.Name, l.Type)
		}
	}
}

func checkStorage(t *testing.T, where, typ, size string, volumes []strimziVolume) {
	t.Helper()
	switch typ {
	case "ephemeral":
	case "persistent-claim":
		if size == "" {
			t.Errorf("%s: persistent-claim storage needs a size", where)
		}
	case "jbod":
		if len(volumes) == 0 {
			t.Errorf("%s: jbod storage needs volumes", where)
		}
		for _, v := range volumes {
			if v.ID == nil || (v.Type != "persistent-claim" && v.Type != "ephemeral") || (v.Type == "persistent-claim" && v.Size == "") {
				t.Errorf("%s: jbod volume needs an id, a type (persistent-claim or ephemeral) and, if persistent, a size", where)
			}
			if v.KraftMetadata != "" && v.KraftMetadata != "shared" {
				t.Errorf("%s: kraftMetadata %q is not shared", where, v.KraftMetadata)
			}
		}
	default:
		t.Errorf("%s: storage type %q is not ephemeral, persistent-claim or jbod", where, typ)
	}
}

func checkTopic(t *testing.T, b *build, tp *strimziTopic, kafkas map[string]*strimziKafka, brokers map[string]int32) {
	t.Helper()
	where := "KafkaTopic " + tp.Metadata.Name
	cluster := tp.Metadata.Labels[strimziClusterLabel]
	k := kafkas[cluster]
	if k == nil {
		t.Errorf("%s: label %s=%q names no Kafka in the build", where, strimziClusterLabel, cluster)
	}
	if tp.Spec == nil || tp.Spec.Partitions == nil || tp.Spec.Replicas == nil {
		t.Errorf("%s: set spec.partitions and spec.replicas (spec is required in v1; the broker defaults are not sized for kvindex)", where)
		return
	}
	partitions, reps := *tp.Spec.Partitions, *tp.Spec.Replicas
	if reps > brokers[cluster] {
		t.Errorf("%s: %d replicas but the cluster has %d brokers", where, reps, brokers[cluster])
	}
	if isr, err := configInt(tp.Spec.Config["min.insync.replicas"]); err != nil || isr >= int64(reps) {
		t.Errorf("%s: min.insync.replicas %v must be a number below replicas %d, so a broker can restart without stopping producers", where, tp.Spec.Config["min.insync.replicas"], reps)
	}
	// DESIGN, semantics 8: use LogAppendTime so producers' clocks cannot
	// age endpoints.
	if tp.Spec.Config["message.timestamp.type"] != "LogAppendTime" {
		t.Errorf("%s: message.timestamp.type must be LogAppendTime", where)
	}
	if ms, err := configInt(tp.Spec.Config["retention.ms"]); err != nil || (ms >= 0 && ms < 3600_000) {
		t.Errorf("%s: retention.ms %v: keep at least an hour to replay (-1 keeps forever)", where, tp.Spec.Config["retention.ms"])
	}
	topic := tp.Metadata.Name
	if tp.Spec.TopicName != "" {
		topic = tp.Spec.TopicName
	}
	kcs, _ := kvContainers(b)
	var ingesters int
	for _, kc := range kcs {
		if kc.Role != "ingester" {
			continue
		}
		ingesters++
		if kc.Flags["topic"] != topic {
			continue
		}
		if kc.W.Replicas > partitions {
			t.Errorf("%s: %d partitions but %s runs %d ingesters; the extra ones would idle", where, partitions, kc.W, kc.W.Replicas)
		}
		if partitions < 2*kc.W.Replicas {
			t.Errorf("%s: %d partitions; create at least 2 x the %d ingesters of %s to leave room to grow (repartitioning remaps endpoints)", where, partitions, kc.W.Replicas, kc.W)
		}
		if k != nil {
			checkBootstrap(t, kc, k)
		}
	}
	if ingesters > 0 && !topicRead(kcs, topic) {
		t.Errorf("%s: no ingester reads topic %q", where, topic)
	}
}

func topicRead(kcs []*kvContainer, topic string) bool {
	for _, kc := range kcs {
		if kc.Role == "ingester" && kc.Flags["topic"] == topic {
			return true
		}
	}
	return false
}

// checkBootstrap requires the ingester's --brokers to be the Kafka
// cluster's bootstrap Service on a plain listener (the roles have no Kafka
// TLS or SASL flags).
func checkBootstrap(t *testing.T, kc *kvContainer, k *strimziKafka) {
	t.Helper()
	svc := k.Metadata.Name + "-kafka-bootstrap"
	for _, addr := range strings.Split(kc.Flags["brokers"], ",") {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s: broker %q: %v", kc, addr, err)
			continue
		}
		if first, _, _ := strings.Cut(host, "."); first != svc {
			t.Errorf("%s: broker %s is not Kafka %s's bootstrap Service %s", kc, addr, k.Metadata.Name, svc)
		}
		var plain bool
		for _, l := range k.Spec.Kafka.Listeners {
			if strconv.Itoa(int(l.Port)) == port && l.TLS != nil && !*l.TLS {
				plain = true
			}
		}
		if !plain {
			t.Errorf("%s: broker port %s is no plain (non-TLS) listener of Kafka %s", kc, port, k.Metadata.Name)
		}
	}
}

// configInt reads a Kafka config value, which Strimzi accepts as a number
// or a string.
func configInt(v any) (int64, error) {
	switch n := v.(type) {
	case int64:
		return n, nil
	case string:
		return strconv.ParseInt(n, 10, 64)
	default:
		return 0, fmt.Errorf("%v (%T) is not an integer", v, v)
	}
}

// kafkaDefaultMaxMessageBytes is Kafka's default message.max.bytes, the
// largest record batch a topic accepts unless it or its cluster sets more.
const kafkaDefaultMaxMessageBytes = 1048588

// bridgeRecordOverhead is what docs/bridge.md says a topic must allow
// beyond the bridge's --max-record-bytes (headers and batch framing).
const bridgeRecordOverhead = 2048

// TestTopicTakesBridgeRecords: every KV event topic accepts the largest
// record any bridge produces (--max-record-bytes + 2 KiB, docs/bridge.md),
// effective values across builds, since the bridges (examples) and the
// topic (overlays/strimzi) meet in one cluster. A refused record stops the
// bridge with an error.
func TestTopicTakesBridgeRecords(t *testing.T) {
	var largest int
	var from *kvContainer
	var topics int
	for _, b := range okBuilds(t) {
		kcs, _ := kvContainers(b)
		for _, k := range kcs {
			if k.Role != "bridge" || k.Cmd == nil {
				continue
			}
			n, err := k.Cmd.Flags().GetInt("max-record-bytes")
			if err != nil {
				t.Fatal(err)
			}
			if n > largest {
				largest, from = n, k
			}
		}
	}
	if from == nil {
		t.Fatal("no bridge in the builds")
	}
	for _, b := range okBuilds(t) {
		kafkas := map[string]*strimziKafka{}
		for _, k := range typed[strimziKafka](b) {
			kafkas[k.Metadata.Name] = k
		}
		for _, tp := range typed[strimziTopic](b) {
			topics++
			limit, source := int64(kafkaDefaultMaxMessageBytes), "Kafka's default message.max.bytes"
			if k := kafkas[tp.Metadata.Labels[strimziClusterLabel]]; k != nil && k.Spec != nil && k.Spec.Kafka != nil {
				if v, ok := k.Spec.Kafka.Config["message.max.bytes"]; ok {
					n, err := configInt(v)
					if err != nil {
						t.Fatalf("Kafka %s: message.max.bytes: %v", k.Metadata.Name, err)
					}
					limit, source = n, "the cluster's message.max.bytes"
				}
			}
			if tp.Spec != nil {
				if v, ok := tp.Spec.Config["max.message.bytes"]; ok {
					n, err := configInt(v)
					if err != nil {
						t.Fatalf("KafkaTopic %s: max.message.bytes: %v", tp.Metadata.Name, err)
					}
					limit, source = n, "its max.message.bytes"
				}
			}
			if need := int64(largest + bridgeRecordOverhead); limit < need {
				t.Errorf("%s: KafkaTopic %s accepts %d bytes (%s), under %s's --max-record-bytes %d + %d",
					b.Dir, tp.Metadata.Name, limit, source, from, largest, bridgeRecordOverhead)
			}
		}
	}
	if topics == 0 {
		t.Fatal("no KafkaTopic in the builds (overlays/strimzi should have one)")
	}
}
