#!/bin/bash
# scenario.sh FORMAT(map|array) SEED HTTPPORT PUBPORT REPLAYPORT OUT
# Runs llm-d-inference-sim ($SIM_BIN) against the recorder ($REC_BIN, rec.go.txt
# built as a Go program) and drives it through the recorded scenario.
# Logs go to $LOG_DIR.
set -e
SIM_BIN=${SIM_BIN:-llm-d-inference-sim} REC_BIN=${REC_BIN:-./rec} LOG_DIR=${LOG_DIR:-.}
FMT=$1 SEED=$2 HP=$3 PP=$4 RP=$5 OUT=$6
MODEL=sim-model
coproc REC { "$REC_BIN" 127.0.0.1:$PP $OUT 127.0.0.1:$RP; }
sleep 0.3
cmd() { echo "$*" >&${REC[1]}; read -r ans <&${REC[0]}; }
MAPFLAG=false; [ "$FMT" = map ] && MAPFLAG=true
POD_IP=127.0.0.1 VLLM_SERVER_DEV_MODE=1 "$SIM_BIN" --model $MODEL --port $HP --enable-kvcache \
  --kv-cache-size 24 --block-size 16 --hash-seed $SEED --zmq-endpoint tcp://127.0.0.1:$PP \
  --event-batch-size 16 --use-vllm-map-event-format=$MAPFLAG --kv-events-replay-endpoint tcp://127.0.0.1:$RP \
  --force-dummy-tokenizer --enable-sleep-mode > "$LOG_DIR"/sim-$FMT.log 2>&1 &
SIM=$!
for i in $(seq 50); do curl -sf localhost:$HP/health >/dev/null && break; sleep 0.2; done
sleep 1.5
gen() { # gen NOTE from to  (token ids from..to inclusive)
  cmd note "$1"
  toks=$(seq -s, $2 $3)
  curl -sf -X POST localhost:$HP/inference/v1/generate -H 'content-type: application/json' \
    -d "{\"model\":\"$MODEL\",\"token_ids\":[$toks],\"sampling_params\":{\"max_tokens\":1}}" >/dev/null
  sleep 0.5
}
gen "prompt A: 4 blocks" 1 64
gen "prompt B: A's first 2 blocks + 2 new" 1 32
gen "prompt B2: B's 2 + 2 new" 1 64 
cmd note "prompt B3"
toks="$(seq -s, 1 32),$(seq -s, 1001 1032)"
curl -sf -X POST localhost:$HP/inference/v1/generate -H 'content-type: application/json' \
  -d "{\"model\":\"$MODEL\",\"token_ids\":[$toks],\"sampling_params\":{\"max_tokens\":1}}" >/dev/null
sleep 0.5
gen "prompt C: 20 new blocks, evicts" 2001 2320
gen "prompt A again: partially evicted" 1 64
cmd replay 0
cmd replay 3
cmd note "dropping the PUB connection"
cmd drop
sleep 2.5
gen "prompt D after reconnect: 3 blocks" 3001 3048
cmd note "sleep"
curl -sf -X POST "localhost:$HP/sleep" >/dev/null || echo sleep failed
sleep 0.5
curl -sf -X POST "localhost:$HP/wake_up" >/dev/null || echo wake failed
for i in $(seq 20); do curl -s localhost:$HP/is_sleeping | grep -q false && break; sleep 0.2; done
sleep 1
gen "prompt E after wake-up: 2 blocks" 4001 4032
cmd replay 0
cmd note "end"
curl -s localhost:$HP/metrics | grep -E "^vllm:(gpu_cache_usage_perc|kv_cache_usage_perc)" > "$LOG_DIR"/metrics-$FMT.txt || true
kill $SIM; wait $SIM 2>/dev/null || true
eval "exec ${REC[1]}>&-"
wait
