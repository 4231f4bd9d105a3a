#!/bin/bash
# Live check (issue 25): kvindex standalone (token mode) + one bind-mode
# bridge + three llm-d-inference-sim pods that connect to it (two in the
# array format, one in the map format, three hash seeds). Run it in a
# scratch directory; KVINDEX is the kvindex binary, SIM_BIN the sim's.
set -u
rm -rf data; mkdir -p logs
K=${KVINDEX:-kvindex}
$K standalone --data-dir data --etcd-listen 127.0.0.1:23790 --kafka-listen 127.0.0.1:29092 --listen 127.0.0.1:25051 --metrics-listen 127.0.0.1:29090 --hash-mode token > logs/standalone.log 2>&1 &
SA=$!
sleep 4
$K bridge --zmq-bind 'tcp://127.0.0.1:25557' --replay-pattern 'tcp://{host}:25558' --brokers 127.0.0.1:29092 --topic kvindex-events --metrics-listen 127.0.0.1:29091 --log-level info > logs/bridge.log 2>&1 &
BR=$!
sleep 1
SIMS=()
i=0
for spec in "array 11" "array 12" "map 13"; do
  set -- $spec
  ip=127.0.0.$((31+i)); port=$((28001+i))
  MAPFLAG=false; [ "$1" = map ] && MAPFLAG=true
  POD_IP=$ip VLLM_SERVER_DEV_MODE=1 "${SIM_BIN:-llm-d-inference-sim}" --model live-model --port $port --enable-kvcache \
    --kv-cache-size 24 --block-size 16 --hash-seed $2 --zmq-endpoint tcp://127.0.0.1:25557 --event-batch-size 16 \
    --use-vllm-map-event-format=$MAPFLAG --kv-events-replay-endpoint tcp://$ip:25558 --force-dummy-tokenizer --enable-sleep-mode > logs/sim-$i.log 2>&1 &
  SIMS+=($!)
  i=$((i+1))
done
for p in 28001 28002 28003; do for j in $(seq 50); do curl -sf localhost:$p/health >/dev/null && break; sleep 0.2; done; done
sleep 2
gen() { # port from to
  toks=$(seq -s, $2 $3)
  curl -sf -X POST localhost:$1/inference/v1/generate -H 'content-type: application/json' \
    -d "{\"model\":\"live-model\",\"token_ids\":[$toks],\"sampling_params\":{\"max_tokens\":1}}" >/dev/null || echo "gen failed $1"
}
# Shared prefix 1..64 on every pod; pod-specific continuations.
for p in 28001 28002 28003; do gen $p 1 64; done
gen 28001 1 96          # +2 blocks on pod 0
gen 28002 1 32          # shares 2
gen 28003 5001 5080     # 5 other blocks on pod 2
sleep 2
lookup() { echo -n "lookup tokens $1..$2: "; $K lookup --index 127.0.0.1:25051 --model live-model --tokens "$(seq -s, $1 $2)" -o json 2>&1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(", ".join("%s=%d" % (e["pod"], e["blocks"]) for e in d["endpoints"]) or "none")'; }
echo "== after prompts"
lookup 1 96
lookup 5001 5080
# Evictions: overflow pod 1's cache.
gen 28002 7001 7336
sleep 2
echo "== after pod 1 overflowed (21 new blocks onto 4, cache 24: one eviction)"
lookup 1 96
lookup 7001 7336
gen 28002 1 64
sleep 2
echo "== pod 1 asked 1..64 again (the evicted block re-stored)"
lookup 1 96
echo "== restarting the bridge"
kill $BR; wait $BR 2>/dev/null
$K bridge --zmq-bind 'tcp://127.0.0.1:25557' --replay-pattern 'tcp://{host}:25558' --brokers 127.0.0.1:29092 --topic kvindex-events --metrics-listen 127.0.0.1:29091 --log-level info > logs/bridge2.log 2>&1 &
BR=$!
sleep 3
gen 28003 9001 9032
sleep 2
echo "== after the bridge restart, pod 2 stored 2 more"
lookup 1 96
lookup 5001 5080
lookup 9001 9032
# Sleep pod 0: AllBlocksCleared.
curl -sf -X POST localhost:28001/sleep; sleep 1; curl -sf -X POST localhost:28001/wake_up; sleep 2
echo "== after pod 0 slept"
lookup 1 96
echo "== bridge metrics"
curl -s 127.0.0.1:29091/metrics | grep -E "^kvindex_bridge_(pods|resyncs_total|gaps_total|unknown_topics_total|records_produced_total|batches_replayed_total|replay_requests_total)" | grep -v " 0$"
echo "== ingester unkeyed"
curl -s 127.0.0.1:29090/metrics | grep -E "unkeyed_blocks_total|map_entries" | grep -v "^#"
for p in 28001 28002 28003; do echo "sim $p usage: $(curl -s localhost:$p/metrics | grep -E '^vllm:kv_cache_usage_perc')"; done
kill ${SIMS[@]} $BR; sleep 1; kill $SA; wait 2>/dev/null
