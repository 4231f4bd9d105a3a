// Command kvindex-epp is the Gateway API Inference Extension's endpoint
// picker (GIE v1.5.0's EPP runner, its flags unchanged) with kvindex's
// plugins registered: kvindex-prefix-cache-producer and
// kvindex-tier-scorer, the way GIE documents out-of-tree plugins. Their
// metrics are served with the EPP's own.
//
// Running it needs a Kubernetes API server (the runner watches the
// InferencePool and its pods); deploy/examples/gie shows a Deployment.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"

	"github.com/kvindex/kvindex/router/gie"
)

func main() {
	metrics := gie.Register()
	r := runner.NewRunner().WithExecutableName("kvindex-epp").WithCustomCollectors(metrics)
	if err := r.Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
