package gie

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestIdentity(t *testing.T) {
	ep := func(name, port string) EndpointRef {
		return EndpointRef{Namespace: "models", Name: name, PodName: "vllm-a", Address: "10.0.0.7", Port: port}
	}
	tests := []struct {
		name    string
		mapper  IdentityMapper
		ep      EndpointRef
		want    Identity
		wantErr error
	}{
		{"default_rank_0", IdentityMapper{}, ep("vllm-a-rank-0", "8000"), Identity{Pod: "10.0.0.7:8000"}, nil},
		{"default_rank_1_port_offset", IdentityMapper{}, ep("vllm-a-rank-1", "8001"), Identity{Pod: "10.0.0.7:8000", Rank: 1}, nil},
		{"stride_2", IdentityMapper{RankPortStride: 2}, ep("vllm-a-rank-2", "8004"), Identity{Pod: "10.0.0.7:8000", Rank: 2}, nil},
		{"ranks_none_keeps_port", IdentityMapper{Ranks: RanksNone}, ep("vllm-a-rank-1", "8001"), Identity{Pod: "10.0.0.7:8001"}, nil},
		{"namespaced_name", IdentityMapper{PodIdentity: PodIdentityNamespacedName}, ep("vllm-a-rank-1", "8001"), Identity{Pod: "models/vllm-a", Rank: 1}, nil},
		{"namespaced_name_ranks_none", IdentityMapper{PodIdentity: PodIdentityNamespacedName, Ranks: RanksNone}, ep("vllm-a-rank-1", "8001"), Identity{Pod: "models/vllm-a-rank-1"}, nil},
		{"pod_name", IdentityMapper{PodIdentity: PodIdentityPodName}, ep("vllm-a-rank-3", "8003"), Identity{Pod: "vllm-a", Rank: 3}, nil},
		{"pod_name_from_endpoint_name", IdentityMapper{PodIdentity: PodIdentityPodName}, EndpointRef{Name: "vllm-b-rank-2"}, Identity{Pod: "vllm-b", Rank: 2}, nil},
		{"ipv6", IdentityMapper{}, EndpointRef{Name: "p-rank-0", Address: "fd00::1", Port: "8000"}, Identity{Pod: "fd00::1:8000"}, nil},
		{"no_suffix_is_rank_0", IdentityMapper{}, EndpointRef{Name: "plain", Address: "10.0.0.8", Port: "8000"}, Identity{Pod: "10.0.0.8:8000"}, nil},
		{"malformed_suffix_is_no_rank", IdentityMapper{}, EndpointRef{Name: "p-rank-01", Address: "10.0.0.8", Port: "8001"}, Identity{Pod: "10.0.0.8:8001"}, nil},
		{"rank_below_port", IdentityMapper{RankPortStride: 9000}, ep("vllm-a-rank-1", "8001"), Identity{}, ErrIdentity},
		{"no_address", IdentityMapper{}, EndpointRef{Name: "p-rank-0", Port: "8000"}, Identity{}, ErrIdentity},
		{"bad_port", IdentityMapper{}, EndpointRef{Name: "p-rank-0", Address: "10.0.0.1", Port: "http"}, Identity{}, ErrIdentity},
		{"empty_pod_name", IdentityMapper{PodIdentity: PodIdentityPodName}, EndpointRef{}, Identity{}, ErrIdentity},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.mapper.Identity(tc.ep)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("identity (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIdentityMapperValidate(t *testing.T) {
	for _, m := range []IdentityMapper{{PodIdentity: "ip"}, {Ranks: "offset"}, {RankPortStride: -1}} {
		if err := m.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig", m, err)
		}
	}
	if err := (IdentityMapper{PodIdentity: PodIdentityPodName, Ranks: RanksNone}).Validate(); err != nil {
		t.Errorf("valid mapper: %v", err)
	}
}
