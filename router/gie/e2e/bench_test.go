package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	approx "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"

	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
)

// BenchmarkPrepareData times one request's PrepareRequestData and
// PreRequest of the kvindex producer (a token-mode Lookup of a real
// indexd over loopback gRPC, tokens given: no tokenize call) and of GIE's
// approximate producer, on the same requests (64 prompts of 1024 tokens,
// some held by a pod of three) and the same endpoints. It reports the
// per-request p50 and p99 besides ns/op.
func BenchmarkPrepareData(b *testing.B) {
	f := startFleet(b, nil)
	tok := epptest.StartTokenizer(b)
	const prompts, words = 64, 1024
	texts := make([]string, prompts)
	for i := range prompts {
		text, p := prompt(fmt.Sprintf("bench%d-", i), words)
		texts[i] = text
		if i%2 == 0 {
			f.store(podID(i%3), 0, p, words/blockSize, "GPU")
		}
	}
	_, last := prompt(fmt.Sprintf("bench%d-", prompts-2), words)
	f.waitMatch(last, podID((prompts-2)%3), 0, words/blockSize)
	gie.Register()
	e := epptest.Start(b, eppConfig(b, f.st.GRPCAddr(), tok.URL(), nil, false), pods, []int{8000})
	kv := e.Handle.Plugin(gie.ProducerType).(*gie.Producer)
	ap := e.Handle.Plugin(approx.ApproxPrefixCachePluginType).(requestcontrol.PrepareDataPlugin)
	for _, bc := range []struct {
		name string
		p    requestcontrol.PrepareDataPlugin
	}{{"kvindex", kv}, {"approximate", ap}} {
		b.Run(bc.name, func(b *testing.B) {
			pre := bc.p.(requestcontrol.PreRequest)
			lat := make([]time.Duration, 0, b.N)
			i := 0
			for b.Loop() {
				text := texts[i%prompts]
				req := &framework.LLMRequest{RequestId: fmt.Sprint(i), TargetModel: model,
					Body:            &framework.LLMRequestBody{Completions: &framework.CompletionsRequest{Prompt: framework.Prompt{Raw: text}}},
					TokenizedPrompt: &framework.TokenizedPrompt{TokenIDs: epptest.Words(text)}}
				eps := candidates(e)
				start := time.Now()
				if err := bc.p.PrepareRequestData(b.Context(), req, eps); err != nil {
					b.Fatal(err)
				}
				pre.PreRequest(b.Context(), req, &framework.SchedulingResult{PrimaryProfileName: "default",
					ProfileResults: map[string]*framework.ProfileRunResult{"default": {TargetEndpoints: eps[:1]}}})
				lat = append(lat, time.Since(start))
				i++
			}
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()), "p99-ns")
			}
		})
	}
}
