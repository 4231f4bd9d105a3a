package client_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/client"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// standIn plays an indexd replica for the example: vllm-0 holds the whole
// prompt on GPU, vllm-1 its first two blocks (the second offloaded to CPU).
type standIn struct {
	kvindexv1.UnimplementedIndexServiceServer
}

func (standIn) Lookup(_ context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	gpu, cpu := kvindexv1.Tier_TIER_GPU, kvindexv1.Tier_TIER_CPU
	return &kvindexv1.LookupResponse{Revision: 7, Matches: []*kvindexv1.EndpointMatch{
		{Endpoint: &kvindexv1.Endpoint{Pod: "default/vllm-0"}, MatchedBlocks: uint32(len(req.BlockHashes)), Tiers: []kvindexv1.Tier{gpu, gpu, gpu}},
		{Endpoint: &kvindexv1.Endpoint{Pod: "default/vllm-1"}, MatchedBlocks: 2, Tiers: []kvindexv1.Tier{gpu, cpu}},
	}}, nil
}

// A router hashes a prompt the way its vLLM engines do, asks kvindex which
// endpoints hold its prefix, and scores them.
func Example() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	kvindexv1.RegisterIndexServiceServer(srv, standIn{})
	go srv.Serve(l)
	defer srv.Stop()

	// Engines run with PYTHONHASHSEED=0, block size 16 and
	// --prefix-caching-hash-algo sha256_cbor.
	hasher, err := client.NewHasher("0", 16)
	if err != nil {
		log.Fatal(err)
	}
	tokens := make([]uint32, 50) // three full blocks and a partial one (the fixture seed0_bs16_ascii)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	hashes := hasher.BlockHashes(tokens, client.HashExtras{})
	fmt.Printf("block hashes: %x\n", hashes)

	// In production: client.New("dns:///indexd.kvindex:50051").
	c, err := client.New(l.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	res, err := c.Lookup(context.Background(), "meta-llama/Llama-3.1-8B-Instruct", hashes)
	if err != nil {
		log.Fatal(err)
	}
	scores := client.Score(res.Matches, len(hashes), client.DefaultTierWeights())
	for _, m := range res.Matches {
		fmt.Printf("%s rank %d: %d blocks %v, score %.2f\n", m.Endpoint.Pod, m.Endpoint.DPRank, m.Blocks, m.Tiers, scores[m.Endpoint])
	}
	// Output:
	// block hashes: [2ceabcfae6d332ea 26470bbec927f5bf 480a8718e6d0b0b5]
	// default/vllm-0 rank 0: 3 blocks [gpu gpu gpu], score 1.00
	// default/vllm-1 rank 0: 2 blocks [gpu cpu], score 0.60
}
