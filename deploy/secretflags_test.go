package deploy

import (
	"strings"
	"testing"
)

// secretFileFlags maps each kvindex flag that names a secret or
// certificate file to the Secret key the manifests mount at that path
// (docs/security.md, "Secrets").
var secretFileFlags = map[string]string{
	"tls-cert-file":            "tls.crt",
	"tls-key-file":             "tls.key",
	"tls-client-ca-file":       "ca.crt",
	"etcd-password-file":       "password",
	"kafka-tls-ca-file":        "ca.crt",
	"kafka-tls-cert-file":      "tls.crt",
	"kafka-tls-key-file":       "tls.key",
	"kafka-sasl-password-file": "password",
}

// TestSecretsAreFiles checks every kvindex container of every build: each
// file flag of secretFileFlags names the right key of a Secret volume the
// container's user can read (mounted as a file, updated in place on
// rotation: no subPath), and no flag or environment variable carries a
// password itself.
func TestSecretsAreFiles(t *testing.T) {
	sawSecretFlag := false
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			kcs, _ := kvContainers(b) // TestKvindexRoles reports the problems
			for _, k := range kcs {
				for flag, value := range k.Flags {
					if key, ok := secretFileFlags[flag]; ok {
						sawSecretFlag = true
						checkTLSFile(t, k.String(), k.W, k.C, "--"+flag, value, key)
						continue
					}
					if strings.Contains(flag, "password") || strings.Contains(flag, "secret") {
						t.Errorf("%s: --%s passes a secret on the command line; use a *-file flag", k, flag)
					}
				}
				for name := range k.Env {
					if n := strings.ToLower(name); strings.Contains(n, "password") || strings.Contains(n, "secret") {
						t.Errorf("%s: environment variable %s looks like a secret; mount it as a file", k, name)
					}
				}
			}
		})
	}
	if !sawSecretFlag {
		t.Fatal("no build sets any secret file flag; is overlays/prod-tls built?")
	}
}

// TestTLSOverlayProtectsEveryConnection checks overlays/prod-tls: indexd
// serves mutual TLS and logs in to etcd as its own user; the ingester
// speaks TLS and SCRAM to Kafka and logs in to etcd as its own user; both
// dial etcd over https with a client certificate.
func TestTLSOverlayProtectsEveryConnection(t *testing.T) {
	want := map[string]map[string]string{
		"indexd": {
			"tls-cert-file": "", "tls-key-file": "", "tls-client-ca-file": "", "health-listen": "",
			"etcd-cacert": "", "etcd-cert": "", "etcd-key": "", "etcd-username": "kvindex-indexd", "etcd-password-file": "",
		},
		"ingester": {
			"kafka-tls-ca-file": "", "kafka-sasl-mechanism": "SCRAM-SHA-512", "kafka-sasl-username": "kvindex-ingester", "kafka-sasl-password-file": "",
			"etcd-cacert": "", "etcd-cert": "", "etcd-key": "", "etcd-username": "kvindex-ingester", "etcd-password-file": "",
		},
	}
	for _, b := range okBuilds(t) {
		if b.Dir != "overlays/prod-tls" {
			continue
		}
		kcs, _ := kvContainers(b)
		seen := map[string]bool{}
		for _, k := range kcs {
			seen[k.Role] = true
			for flag, value := range want[k.Role] {
				got, ok := k.Flags[flag]
				if !ok || got == "" || (value != "" && got != value) {
					t.Errorf("%s: --%s=%q, want it set%s", k, flag, got, map[bool]string{true: " to " + value}[value != ""])
				}
			}
			for _, ep := range strings.Split(k.Flags["etcd-endpoints"], ",") {
				if k.Flags["etcd-endpoints"] != "" && !strings.HasPrefix(ep, "https://") {
					t.Errorf("%s: etcd endpoint %q is not https", k, ep)
				}
			}
		}
		if !seen["indexd"] || !seen["ingester"] {
			t.Fatalf("overlays/prod-tls runs roles %v, want indexd and ingester", seen)
		}
		return
	}
	t.Fatal("no build overlays/prod-tls")
}

// TestBridgeTLSExample checks examples/vllm-sidecar-tls: the bridge
// sidecar speaks TLS and SCRAM to Kafka as its own producer user, its
// password and CA from Secret files (TestSecretsAreFiles checks those).
func TestBridgeTLSExample(t *testing.T) {
	want := map[string]string{"kafka-tls-ca-file": "", "kafka-sasl-mechanism": "SCRAM-SHA-512", "kafka-sasl-username": "kvindex-bridge", "kafka-sasl-password-file": ""}
	for _, b := range okBuilds(t) {
		if b.Dir != "examples/vllm-sidecar-tls" {
			continue
		}
		kcs, _ := kvContainers(b)
		bridges := 0
		for _, k := range kcs {
			if k.Role != "bridge" {
				continue
			}
			bridges++
			for flag, value := range want {
				if got := k.Flags[flag]; got == "" || (value != "" && got != value) {
					t.Errorf("%s: --%s=%q, want it set (to %q if given)", k, flag, got, value)
				}
			}
			if !strings.HasSuffix(k.Flags["brokers"], ":9093") {
				t.Errorf("%s: --brokers=%s, want the TLS listener :9093", k, k.Flags["brokers"])
			}
		}
		if bridges == 0 {
			t.Fatal("examples/vllm-sidecar-tls runs no bridge")
		}
		return
	}
	t.Fatal("no build examples/vllm-sidecar-tls")
}
