package logging

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{name: "plain_url", in: "http://127.0.0.1:2379", want: "http://127.0.0.1:2379"},
		{name: "user_and_password", in: "https://kvindex:s3cret@etcd-0.etcd:2379", want: "https://REDACTED@etcd-0.etcd:2379"},
		{name: "user_only", in: "https://kvindex@etcd:2379", want: "https://REDACTED@etcd:2379"},
		{name: "escaped_password", in: "http://u:p%40ss@h:1", want: "http://REDACTED@h:1"},
		{name: "unparsable_url", in: "http://u:pa ss%zz@h:1/", want: "http://REDACTED@h:1/"},
		{name: "bare_host_port", in: "broker-0:9092", want: "broker-0:9092"},
		{name: "bare_with_credentials", in: "alice:pw@broker-0:9092", want: "REDACTED@broker-0:9092"},
		{name: "at_in_password", in: "alice:p@w@broker-0:9092", want: "REDACTED@broker-0:9092"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RedactURL(tc.in); got != tc.want {
				t.Fatalf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
	in := []string{"http://a:b@h:1", "h:2"}
	if diff := cmp.Diff([]string{"http://REDACTED@h:1", "h:2"}, RedactURLs(in)); diff != "" {
		t.Fatalf("RedactURLs (-want +got):\n%s", diff)
	}
	if in[0] != "http://a:b@h:1" {
		t.Fatal("RedactURLs changed its input")
	}
}

func TestRedactAddress(t *testing.T) {
	for in, want := range map[string]string{
		"h:1":                       "h:1",
		"a:1,u:pw@b:2":              "a:1,REDACTED@b:2",
		"tcp://u:pw@h:1,dns:///x:1": "tcp://REDACTED@h:1,dns:///x:1",
		"dns://u:pw@10.0.0.53/x:1":  "dns://REDACTED@10.0.0.53/x:1",
		"":                          "",
	} {
		if got := RedactAddress(in); got != want {
			t.Errorf("RedactAddress(%q) = %q, want %q", in, got, want)
		}
	}
}
