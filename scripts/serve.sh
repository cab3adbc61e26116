#!/usr/bin/env bash
# Loopback Prefect server + process work pool + deployments + worker (`make serve`),
# their shutdown (`make serve-stop`) and the MLflow UI (`make ui`).
# Expects the project's venv first on PATH (the Makefile does that).
set -euo pipefail
cd "$(dirname "$0")/.."
export PARAVT_ROOT="$PWD"
PORT="${PREFECT_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
STATE="${PREFECT_HOME:-$PWD/.prefect}"
mkdir -p "$STATE"
POOL=paravt-process
ROWS_POOL=paravt-rows  # run.fanout.runner: work_pool (docs/scale.md "Rows on a cluster")

wait_for_server() {
  for _ in $(seq 1 120); do
    if python -c "import urllib.request,sys; urllib.request.urlopen('${PREFECT_API_URL}/health', timeout=2)" 2>/dev/null; then
      return 0
    fi
    sleep 1
  done
  echo "Prefect server did not answer on ${PREFECT_API_URL} within 120 s; see $STATE/server.log" >&2
  exit 1
}

start_worker() {  # start_worker NAME ARGS...: `prefect worker start ARGS` unless NAME's pid lives
  local name="$1"
  shift
  if [ -f "$STATE/$name.pid" ] && kill -0 "$(cat "$STATE/$name.pid")" 2>/dev/null; then
    echo "$name already running (pid $(cat "$STATE/$name.pid"))"
  else
    setsid nohup prefect worker start "$@" >"$STATE/$name.log" 2>&1 &
    echo $! >"$STATE/$name.pid"
  fi
}

start() {
  if [ -f "$STATE/server.pid" ] && kill -0 "$(cat "$STATE/server.pid")" 2>/dev/null; then
    echo "Prefect server already running (pid $(cat "$STATE/server.pid"))"
  else
    setsid nohup prefect server start --host 127.0.0.1 --port "$PORT" >"$STATE/server.log" 2>&1 &
    echo $! >"$STATE/server.pid"
  fi
  wait_for_server
  for pool in "$POOL" "$ROWS_POOL"; do
    prefect work-pool inspect "$pool" >/dev/null 2>&1 || prefect work-pool create "$pool" --type process
  done
  prefect --no-prompt deploy --all
  start_worker worker --pool "$POOL" --type process
  # This machine's rows worker: one row at a time; on a cluster, one such worker per node.
  start_worker rows-worker --pool "$ROWS_POOL" --type process --limit 1 --name "rows-$(hostname)"
  cat <<MSG

Prefect server: http://127.0.0.1:${PORT} (log $STATE/server.log), worker logs $STATE/worker.log, $STATE/rows-worker.log
Run the pipeline:
  source .venv/bin/activate
  export PREFECT_API_URL=${PREFECT_API_URL}
  prefect deployment run paravt/full-pipeline --watch
Stop everything: make serve-stop
MSG
}

stop() {
  for name in rows-worker worker server mlflow; do
    if [ -f "$STATE/$name.pid" ]; then
      pid="$(cat "$STATE/$name.pid")"
      kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 -- -"$pid" 2>/dev/null || true
      rm -f "$STATE/$name.pid"
      echo "stopped $name"
    fi
  done
}

ui() {
  start
  DB="${MLFLOW_DB:-$PWD/outputs/tiny/mlflow.db}"
  mkdir -p "$(dirname "$DB")"
  setsid nohup mlflow ui --host 127.0.0.1 --port "$MLFLOW_PORT" --backend-store-uri "sqlite:///$DB" >"$STATE/mlflow.log" 2>&1 &
  echo $! >"$STATE/mlflow.pid"
  echo "MLflow UI: http://127.0.0.1:${MLFLOW_PORT} (backend sqlite:///$DB)"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  ui) ui ;;
  *) echo "usage: $0 start|stop|ui" >&2; exit 2 ;;
esac
