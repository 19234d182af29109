#!/usr/bin/env bash
# The local real Prefect stack: PostgreSQL (Debian's postgresql, data under .stack/), a Prefect
# server on it, the GPU global concurrency limit, the process work pool, both deployments, one worker, and a local S3
# server (SeaweedFS, bucket gpucampaign) for storage.url: s3://gpucampaign/..., and an MLflow
# tracking server (when mlflow is installed: the tracking extra) whose URI the env file exports.
#
#   infra/stack.sh up       start (or complete) the stack; writes $STACK_DIR/env to source
#   infra/stack.sh down     stop the worker's flow runs (cancelled: each saves, closes its
#                           segment and ends Cancelled), the worker, the server, PostgreSQL and
#                           the S3 server
#   infra/stack.sh status   what runs, and whether the API answers
#   infra/stack.sh restart s3  stop and start the S3 server on the same ports (recorded in
#                           $STACK_DIR/s3/s3ports.json): the worker keeps its endpoint
#   infra/stack.sh setup    only the GPU lock, work pool, deployments and automations, on the
#                           server at PREFECT_API_URL (a shared server, compose, Kubernetes)
#   infra/stack.sh automations  only the automations (infra/automations.py), on the stack's
#                           server or the one at PREFECT_API_URL: dead runs marked Crashed, and
#                           the notifications when a target is set (below)
#
# Settings (environment):
#   GPUCAMPAIGN_PREFECT_PORT  server port (default: the running stack's, else 4200; the server
#                             listens on 127.0.0.1 only)
#   STACK_DIR                 PIDs, logs, PREFECT_HOME, the S3 data and keys, and the env file
#                             (default: <repo>/.stack)
#   GPUCAMPAIGN_GPU_SLOTS     size of the GPU lock: GPUs of the committed lots (default 1)
#   GPUCAMPAIGN_GPU_LIMIT     name of the GPU lock (default gpu; spec field gpu_lock.name)
#   GPUCAMPAIGN_POOL          work pool name (default gpucampaign, as in the deployments' prefect.yaml)
#   GPUCAMPAIGN_POOL_TYPE     work pool type when `setup` creates it (default process)
#   GPUCAMPAIGN_ROOT          project root to deploy from (default: the repo holding this script)
#   GPUCAMPAIGN_STACK_TIMEOUT seconds to wait for the server and the worker (default 180)
#   PREFECT_SERVER_DATABASE_CONNECTION_URL  (or PREFECT_API_DATABASE_CONNECTION_URL) a database
#                             you run: passed to the server, and no local PostgreSQL is started
#   GPUCAMPAIGN_PG_BIN        folder of initdb/pg_ctl (default: the newest /usr/lib/postgresql/*/bin)
#   GPUCAMPAIGN_NOTIFY_URL    a webhook that gets the notifications as JSON {"subject", "body"}
#                             (default: none, no notifications)
#   GPUCAMPAIGN_NOTIFY_BLOCK  or a notification block of the server, '<type-slug>/<name>'
#                             (e.g. slack-webhook/team, sendgrid-email/me)
#   GPUCAMPAIGN_CRASHED_AFTER_S  a flow run without a heartbeat for this long is set Crashed
#                             (default 300; the deployments send one every 60 s)
#   GPUCAMPAIGN_MLFLOW        off: no MLflow tracking server (default: one when mlflow is installed)
#   GPUCAMPAIGN_STOP_GRACE_S  `down`: seconds a flow run of the worker has to save and end
#                             (Cancelled) before SIGKILL (default 60)
set -euo pipefail

ROOT="${GPUCAMPAIGN_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
ROOT="$(cd "$ROOT" && pwd)"
STACK_DIR="${STACK_DIR:-$ROOT/.stack}"
# A running stack's port is recorded: `status` and `down` find it without the variable.
PORT="${GPUCAMPAIGN_PREFECT_PORT:-$(cat "$STACK_DIR/server.port" 2>/dev/null || echo 4200)}"
HOST=127.0.0.1
POOL="${GPUCAMPAIGN_POOL:-gpucampaign}"
POOL_TYPE="${GPUCAMPAIGN_POOL_TYPE:-process}"
GPU_LIMIT="${GPUCAMPAIGN_GPU_LIMIT:-gpu}"
GPU_SLOTS="${GPUCAMPAIGN_GPU_SLOTS:-1}"
PREFECT_FILE="src/gpucampaign_prefect/deployments/prefect.yaml"
TIMEOUT="${GPUCAMPAIGN_STACK_TIMEOUT:-180}"
CMD="${1:-}"
API="http://$HOST:$PORT/api"
if [[ "$CMD" == setup || "$CMD" == automations ]] && [[ -n "${PREFECT_API_URL:-}" ]]; then
  API="$PREFECT_API_URL"
fi

die() { echo "stack: error: $*" >&2; exit 1; }
say() { echo "stack: $*"; }

[[ "$PORT" =~ ^[0-9]+$ ]] || die "GPUCAMPAIGN_PREFECT_PORT must be a port number, got '$PORT'"
[[ "$GPU_SLOTS" =~ ^[1-9][0-9]*$ ]] || die "GPUCAMPAIGN_GPU_SLOTS must be a whole number >= 1, got '$GPU_SLOTS'"

# The Makefile puts the venv first on PATH; run by hand, fall back to the repo's .venv.
if ! command -v prefect >/dev/null 2>&1; then
  [[ -x "$ROOT/.venv/bin/prefect" ]] || die "no 'prefect' on PATH and no $ROOT/.venv: run 'make install' first"
  PATH="$ROOT/.venv/bin:$PATH"
fi
PREFECT="$(command -v prefect)"
PY="$(dirname "$PREFECT")/python"   # the interpreter of the venv that holds prefect
[[ -x "$PY" ]] || PY="$(command -v python3)"

mkdir -p "$STACK_DIR"
STACK_DIR="$(cd "$STACK_DIR" && pwd)"

# Everything below talks to this stack only, never to a profile or a server exported elsewhere.
unset PREFECT_PROFILE
export PREFECT_HOME="$STACK_DIR/prefect-home"
export PREFECT_API_URL="$API"
export PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=prefect.server.concurrency.lease_storage.filesystem
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export DO_NOT_TRACK=1
export GPUCAMPAIGN_ROOT="$ROOT"

pidfile() { echo "$STACK_DIR/$1.pid"; }

# The PID recorded for a component, if that process still runs the expected command
# (prefect, unless a second argument names another word of its command line).
live_pid() {
  local f pid
  f="$(pidfile "$1")"
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "${2:-prefect}" || return 1
  echo "$pid"
}

# Start a command in its own session (so `down` can stop its whole process group) with
# SIGINT at its default: a background job of a script inherits SIGINT ignored, and a
# Prefect worker turns SIGTERM into SIGINT, so it would never stop.
launch() {
  local name=$1; shift
  "$PY" - "$STACK_DIR/$name.log" "$@" <<'PYEOF' &
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setsid()
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0); os.dup2(log, 1); os.dup2(log, 2)
os.execvp(sys.argv[2], sys.argv[2:])
PYEOF
  echo $! >"$(pidfile "$name")"
}

# HTTP through the venv's python (no curl needed): http GET|POST PATH -> body on stdout.
http() {
  "$PY" - "$1" "$API$2" <<'PYEOF'
import sys, urllib.request
method, url = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=5) as resp:
        sys.stdout.write(resp.read().decode())
except Exception:
    sys.exit(1)
PYEOF
}

healthy() { http GET /health 2>/dev/null | grep -q true; }

# The S3 server: infra/s3server.py picks free ports and generates the keys at the first start
# (kept in $STACK_DIR/s3, mode 0600; the ports are reused by every later start), creates the
# bucket and waits until it serves data.
S3_DIR="$STACK_DIR/s3"
s3_restart() {
  local before="" exports
  [[ -f "$STACK_DIR/env" ]] && before="$(grep '^export AWS_ENDPOINT_URL=' "$STACK_DIR/env" || true)"
  say "restarting the S3 server (same ports)"
  exports="$("$PY" "$ROOT/infra/s3server.py" restart "$S3_DIR")" \
    || die "the S3 server did not start (see $S3_DIR/weed.log)"
  eval "$exports"
  say "S3 server at $AWS_ENDPOINT_URL, serving data"
  if [[ -n "$before" && "$before" != "export AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL" ]]; then
    say "the S3 endpoint changed (a recorded port was taken): run infra/stack.sh down, then up"
    return 1
  fi
}
s3_up() {
  local exports
  exports="$("$PY" "$ROOT/infra/s3server.py" start "$S3_DIR")" \
    || die "the S3 server did not start (see $S3_DIR/weed.log)"
  eval "$exports"
  export AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_DEFAULT_REGION
  say "S3 server at $AWS_ENDPOINT_URL, bucket gpucampaign (data and log in $S3_DIR)"
}

write_env() {  # the exports a user sources: mode 0600, since it holds the S3 secret key
  local env="$STACK_DIR/env"
  (umask 077; {
    echo "export PATH=\"$(dirname "$PY"):\$PATH\""
    echo "export PREFECT_API_URL=$API"
    for name in AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_DEFAULT_REGION; do
      echo "export $name=${!name}"
    done
  } >"$env")
  chmod 600 "$env"
}

port_free() {  # port_free [PORT]: the Prefect port unless another is named
  # SO_REUSEADDR as the server sets it: a port in TIME_WAIT after a `down` counts as free.
  "$PY" -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.close()' "${1:-$PORT}" 2>/dev/null
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# PostgreSQL for the Prefect server (SQLite locks up once a run pauses for a person): data in
# $STACK_DIR/postgres, TCP on 127.0.0.1 only, no Unix socket, password auth for every
# connection. PostgreSQL refuses to run as root: as root it runs as the user postgres.
PG_DIR="$STACK_DIR/postgres"
PG_PASSWORD_FILE="$STACK_DIR/postgres.password"
PG_PORT_FILE="$STACK_DIR/postgres.port"
EXTERNAL_DB="${PREFECT_SERVER_DATABASE_CONNECTION_URL:-${PREFECT_API_DATABASE_CONNECTION_URL:-}}"
# Only the server gets the URL (it holds the password): not the worker, nor its flow runs.
unset PREFECT_API_DATABASE_CONNECTION_URL PREFECT_SERVER_DATABASE_CONNECTION_URL
DB_URL=""

pg_bindir() {
  local dir
  if [[ -n "${GPUCAMPAIGN_PG_BIN:-}" ]]; then echo "$GPUCAMPAIGN_PG_BIN"; return; fi
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [[ -n "$dir" ]] || dir="$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")"
  [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]] || return 1
  echo "$dir"
}

as_pg() { if ((EUID == 0)); then runuser -u postgres -- "$@"; else "$@"; fi; }

pg_prepare() {  # the data folder, owned by the user that runs the server, and the password
  mkdir -p "$PG_DIR"
  if ((EUID == 0)); then
    id postgres >/dev/null 2>&1 || die "running as root needs the user 'postgres' (apt-get install -y postgresql)"
    chown postgres: "$PG_DIR"
    as_pg test -w "$PG_DIR" \
      || die "the user postgres cannot reach $PG_DIR: make every folder above it searchable (chmod o+x) or set STACK_DIR elsewhere"
  fi
  chmod 700 "$PG_DIR"
  if [[ ! -s "$PG_PASSWORD_FILE" ]]; then
    (umask 077; "$PY" -c 'import secrets; print(secrets.token_hex(24))' >"$PG_PASSWORD_FILE")
  fi
}

pg_init() {  # initdb once: superuser gpucampaign, scram-sha-256 for every connection
  local bin=$1 pwfile="$PG_DIR/initdb.pw"
  [[ -f "$PG_DIR/data/PG_VERSION" ]] && return 0
  say "initialising PostgreSQL in $PG_DIR/data"
  (umask 077; cp "$PG_PASSWORD_FILE" "$pwfile")
  ((EUID == 0)) && chown postgres: "$pwfile"
  if ! as_pg "$bin/initdb" -D "$PG_DIR/data" -U gpucampaign --auth=scram-sha-256 \
      --pwfile="$pwfile" -E UTF8 --no-instructions >"$STACK_DIR/initdb.log" 2>&1; then
    rm -f "$pwfile"
    tail -n 20 "$STACK_DIR/initdb.log" >&2
    die "initdb failed (see $STACK_DIR/initdb.log)"
  fi
  rm -f "$pwfile"
}

pg_up() {
  local bin pid port password
  if [[ -n "$EXTERNAL_DB" ]]; then
    say "the server uses the database of PREFECT_SERVER_DATABASE_CONNECTION_URL"
    DB_URL="$EXTERNAL_DB"
    return
  fi
  bin="$(pg_bindir)" || die "no PostgreSQL server found: apt-get install -y postgresql (or set GPUCAMPAIGN_PG_BIN)"
  pg_prepare
  pg_init "$bin"
  password="$(cat "$PG_PASSWORD_FILE")"
  if pid="$(live_pid postgres postgres)"; then
    port="$(cat "$PG_PORT_FILE")"
    say "PostgreSQL already running (pid $pid, port $port)"
  else
    port="$(cat "$PG_PORT_FILE" 2>/dev/null || true)"
    [[ "$port" =~ ^[0-9]+$ ]] && port_free "$port" || port="$(free_port)"
    echo "$port" >"$PG_PORT_FILE"
    say "starting PostgreSQL on $HOST:$port (log $PG_DIR/postgres.log)"
    as_pg "$bin/pg_ctl" start -w -t "$TIMEOUT" -D "$PG_DIR/data" -l "$PG_DIR/postgres.log" \
      -o "-c listen_addresses=$HOST -p $port -c unix_socket_directories=''" >/dev/null \
      || { tail -n 20 "$PG_DIR/postgres.log" >&2; die "PostgreSQL did not start (see $PG_DIR/postgres.log)"; }
    head -n 1 "$PG_DIR/data/postmaster.pid" >"$(pidfile postgres)"
  fi
  if ! PGPASSWORD="$password" "$bin/psql" -h "$HOST" -p "$port" -U gpucampaign -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'prefect'" | grep -q 1; then
    PGPASSWORD="$password" "$bin/createdb" -h "$HOST" -p "$port" -U gpucampaign prefect \
      || die "could not create the database 'prefect'"
  fi
  DB_URL="postgresql+asyncpg://gpucampaign:$password@$HOST:$port/prefect"
}

pg_down() {  # fast shutdown (SIGINT) by the recorded PID; SIGQUIT (immediate) after 30 s
  local pid
  pid="$(live_pid postgres postgres)" || { rm -f "$(pidfile postgres)"; return 1; }
  say "stopping PostgreSQL (pid $pid)"
  kill -INT "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    say "PostgreSQL (pid $pid) still running after 30s: immediate shutdown"
    kill -QUIT "$pid" 2>/dev/null || true
  fi
  rm -f "$(pidfile postgres)"
}

# The MLflow tracking server (infra/mlflowserver.py): its backend the database 'mlflow' on the
# stack's PostgreSQL (SQLite in $MLFLOW_DIR when the Prefect database is external), its
# artifacts in the S3 bucket under mlflow/, served through it (clients need no S3 keys). Its
# URI goes into the env file only: a campaign is tracked when MLFLOW_TRACKING_URI is set where
# it runs (a sourced env file) or its spec names the server (tracking.mlflow.uri); the stack's
# worker does not get it, so deployment runs stay untracked unless their spec asks.
MLFLOW_DIR="$STACK_DIR/mlflow"
MLFLOW_URI=""

mlflow_backend() {  # the backend URI (with the database password): never on a command line
  local bin password port
  if [[ -n "$EXTERNAL_DB" ]]; then
    mkdir -p "$MLFLOW_DIR"
    echo "sqlite:///$MLFLOW_DIR/mlflow.db"
    return
  fi
  bin="$(pg_bindir)" || die "no PostgreSQL client found for the MLflow database"
  password="$(cat "$PG_PASSWORD_FILE")"
  port="$(cat "$PG_PORT_FILE")"
  if ! PGPASSWORD="$password" "$bin/psql" -h "$HOST" -p "$port" -U gpucampaign -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'mlflow'" | grep -q 1; then
    PGPASSWORD="$password" "$bin/createdb" -h "$HOST" -p "$port" -U gpucampaign mlflow \
      || die "could not create the database 'mlflow'"
  fi
  echo "postgresql+psycopg2://gpucampaign:$password@$HOST:$port/mlflow"  # SQLAlchemy 2.1 would pick psycopg 3
}

mlflow_up() {  # after s3_up (the AWS_* of the artifacts) and pg_up
  local backend exports
  if [[ "${GPUCAMPAIGN_MLFLOW:-on}" == off ]]; then
    say "no MLflow server (GPUCAMPAIGN_MLFLOW=off)"
    return 0
  fi
  if ! "$PY" -c 'import mlflow' 2>/dev/null; then
    say "mlflow is not installed in $(dirname "$PY") (pip install -e '.[tracking]'): no MLflow server"
    return 0
  fi
  backend="$(mlflow_backend)"
  say "MLflow tracking server: backend ${backend%%:*}, artifacts s3://gpucampaign/mlflow (log $MLFLOW_DIR/mlflow.log)"
  exports="$(MLFLOW_BACKEND_STORE_URI="$backend" MLFLOW_S3_ENDPOINT_URL="$AWS_ENDPOINT_URL" \
    "$PY" "$ROOT/infra/mlflowserver.py" start "$MLFLOW_DIR" --artifacts s3://gpucampaign/mlflow)" \
    || die "the MLflow tracking server did not start (see $MLFLOW_DIR/mlflow.log)"
  MLFLOW_URI="${exports#export MLFLOW_TRACKING_URI=}"
  say "MLflow tracking server at $MLFLOW_URI"
}

mlflow_env() {  # add the tracking URI to the env file write_env wrote
  [[ -n "$MLFLOW_URI" ]] || return 0
  echo "export MLFLOW_TRACKING_URI=$MLFLOW_URI" >>"$STACK_DIR/env"
}

mlflow_down() {
  "$PY" "$ROOT/infra/mlflowserver.py" status "$MLFLOW_DIR" >/dev/null 2>&1 || return 1
  say "stopping the MLflow tracking server"
  "$PY" "$ROOT/infra/mlflowserver.py" stop "$MLFLOW_DIR"
}

mlflow_status() {
  local line
  if line="$("$PY" "$ROOT/infra/mlflowserver.py" status "$MLFLOW_DIR" 2>/dev/null)"; then
    say "MLflow tracking server $line"
  else
    say "MLflow tracking server stopped"
  fi
}

wait_for() {  # wait_for WHAT COMPONENT CHECK...: until CHECK succeeds, the component dies, or timeout
  local what=$1 comp=$2; shift 2
  local deadline=$((SECONDS + TIMEOUT))
  until "$@"; do
    if ! live_pid "$comp" >/dev/null; then
      echo "---- last lines of $STACK_DIR/$comp.log ----" >&2
      tail -n 30 "$STACK_DIR/$comp.log" >&2 || true
      die "$what: the $comp process exited"
    fi
    ((SECONDS < deadline)) || die "$what: not ready after ${TIMEOUT}s (see $STACK_DIR/$comp.log)"
    sleep 1
  done
}

run_logged() {  # run_logged LOGNAME CMD...: run, keep output in a log, show its tail on failure
  local log="$STACK_DIR/$1.log"; shift
  if ! "$@" >>"$log" 2>&1; then
    echo "---- last lines of $log ----" >&2
    tail -n 30 "$log" >&2
    die "failed: $*"
  fi
}

worker_registered() {
  http POST "/work_pools/$POOL/workers/filter" 2>/dev/null | grep -q "\"$WORKER_NAME\""
}

WORKER_NAME="gpucampaign-$(uname -n)-$PORT"

setup() {  # the GPU lock, the work pool and both deployments; the API must answer
  healthy || die "no Prefect API answers at $API"
  if "$PREFECT" gcl inspect "$GPU_LIMIT" >/dev/null 2>&1; then
    run_logged setup "$PREFECT" gcl update "$GPU_LIMIT" --limit "$GPU_SLOTS"
    say "GPU lock '$GPU_LIMIT' exists; its size is set to $GPU_SLOTS slot(s)"
  else
    run_logged setup "$PREFECT" gcl create "$GPU_LIMIT" --limit "$GPU_SLOTS"
    say "created GPU lock '$GPU_LIMIT' with $GPU_SLOTS slot(s)"
  fi

  if "$PREFECT" work-pool inspect "$POOL" >/dev/null 2>&1; then
    say "work pool '$POOL' exists"
  else
    run_logged setup "$PREFECT" work-pool create "$POOL" --type "$POOL_TYPE"
    say "created $POOL_TYPE work pool '$POOL'"
  fi

  say "deploying $PREFECT_FILE from $ROOT (log $STACK_DIR/deploy.log)"
  (cd "$ROOT" && run_logged deploy "$PREFECT" --no-prompt deploy --all --prefect-file "$PREFECT_FILE")

  automations
}

# The automations (infra/automations.py, idempotent): a flow run whose heartbeats stop is set
# Crashed; notifications through GPUCAMPAIGN_NOTIFY_URL / GPUCAMPAIGN_NOTIFY_BLOCK when set.
automations() {
  healthy || die "no Prefect API answers at $API"
  local said
  if ! said="$("$PY" "$ROOT/infra/automations.py" 2>&1)"; then
    echo "$said" >>"$STACK_DIR/automations.log"
    echo "$said" | tail -n 20 >&2
    die "the automations could not be set up (see $STACK_DIR/automations.log)"
  fi
  echo "$said" >>"$STACK_DIR/automations.log"
  echo "$said" | grep '^automations: ' | tail -n 1 | sed 's/^automations: /stack: /'
  say "automations set up (log $STACK_DIR/automations.log)"
}

up() {
  local pid
  [[ "$POOL_TYPE" == process ]] || die "up runs a process worker: unset GPUCAMPAIGN_POOL_TYPE (use 'setup' for other pools)"
  s3_up  # first: the worker and its flow runs inherit the AWS_* variables
  pg_up
  mlflow_up
  if pid="$(live_pid server)"; then
    say "server already running (pid $pid)"
  else
    port_free || die "port $PORT on $HOST is taken by another process: stop it or set GPUCAMPAIGN_PREFECT_PORT"
    say "starting the Prefect server on $HOST:$PORT (PREFECT_HOME=$PREFECT_HOME, log $STACK_DIR/server.log)"
    PREFECT_SERVER_DATABASE_CONNECTION_URL="$DB_URL" \
      launch server "$PREFECT" server start --host "$HOST" --port "$PORT"
    echo "$PORT" >"$STACK_DIR/server.port"
  fi
  wait_for "Prefect API at $API" server healthy
  say "API healthy at $API"

  setup

  if pid="$(live_pid worker)"; then
    say "worker already running (pid $pid)"
  else
    say "starting worker '$WORKER_NAME' on pool '$POOL' (log $STACK_DIR/worker.log)"
    (cd "$ROOT" && launch worker "$PREFECT" worker start --pool "$POOL" --type process --name "$WORKER_NAME")
  fi
  wait_for "worker '$WORKER_NAME'" worker worker_registered

  write_env
  mlflow_env
  say "up. UI: http://$HOST:$PORT   Run the example campaign with:"
  echo "  . $STACK_DIR/env   # the venv first on PATH, PREFECT_API_URL and the AWS_* of the S3 server"
  echo "  export PREFECT_API_URL=$API   # (what that file sets for Prefect)"
  echo "  prefect deployment run campaign/main --watch"
  if [[ -n "$MLFLOW_URI" ]]; then
    echo "  MLflow UI: $MLFLOW_URI   (the env file sets MLFLOW_TRACKING_URI: what runs with it is tracked)"
  fi
}

# Stop a component: SIGTERM to its process group, SIGKILL to what is left after a grace period.
stop_group() {
  local name=$1 pid=$2 grace=${3:-20}
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + grace))
  while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
  if kill -0 -- "-$pid" 2>/dev/null; then
    say "$name (pid $pid) still running after ${grace}s: SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
}

# The flow run a flow-run process runs (the worker puts its ID in the process's environment).
flow_run_of() {
  tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^PREFECT__FLOW_RUN_ID=//p' | head -n 1
}

# Set a flow run Cancelling on the server, as a cancel from the UI does: the flow then ends it
# Cancelled after its save (not Crashed, so the relaunch automation leaves it alone).
cancel_flow_run() {
  "$PY" - "$API/flow_runs/$1/set_state" <<'PYEOF'
import json, sys, urllib.request
body = {"state": {"type": "CANCELLING", "message": "the stack was stopped (infra/stack.sh down)"}}
req = urllib.request.Request(sys.argv[1], data=json.dumps(body).encode(), method="POST",
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=10) as resp:
        sys.exit(0 if json.loads(resp.read()).get("status") == "ACCEPT" else 1)
except Exception:
    sys.exit(1)
PYEOF
}

# Stop the worker's flow runs before the worker, the server and the store: each is cancelled on
# the server, then its process group gets SIGTERM (the worker itself would end them without
# waiting): the training saves at its next step, closes its segment, gives its locks back and
# the run ends Cancelled while the server and the S3 store still take it. SIGKILL after
# GPUCAMPAIGN_STOP_GRACE_S seconds (default 60).
stop_flow_runs() {
  local worker=$1 child id grace="${GPUCAMPAIGN_STOP_GRACE_S:-60}"
  [[ "$grace" =~ ^[0-9]+$ ]] || die "GPUCAMPAIGN_STOP_GRACE_S must be a whole number of seconds, got '$grace'"
  for child in $(pgrep -P "$worker" || true); do
    id="$(flow_run_of "$child")"
    if [[ -n "$id" ]] && healthy && cancel_flow_run "$id"; then
      say "stopping flow-run process $child (flow run $id, cancelled; it saves first, up to ${grace}s)"
    else
      say "stopping flow-run process $child${id:+ (flow run $id)} (it saves first, up to ${grace}s)"
    fi
    stop_group flow-run "$child" "$grace" &
  done
  wait
}

down() {
  local pid child stopped=0
  if pid="$(live_pid worker)"; then
    # Flow runs are the worker's children, each in a session of its own: stop them first.
    stop_flow_runs "$pid"
    local children
    children="$(pgrep -P "$pid" || true)"
    say "stopping worker (pid $pid)"
    stop_group worker "$pid"
    for child in $children; do
      if kill -0 "$child" 2>/dev/null; then
        say "stopping flow-run process $child left by the worker"
        stop_group flow-run "$child" 10
      fi
    done
    stopped=1
  fi
  rm -f "$(pidfile worker)"
  if pid="$(live_pid server)"; then
    say "stopping server (pid $pid)"
    stop_group server "$pid"
    stopped=1
  fi
  rm -f "$(pidfile server)" "$STACK_DIR/env" "$STACK_DIR/server.port"
  mlflow_down && stopped=1  # before PostgreSQL, its backend
  pg_down && stopped=1
  if "$PY" "$ROOT/infra/s3server.py" status "$S3_DIR" >/dev/null 2>&1; then
    say "stopping the S3 server"
    "$PY" "$ROOT/infra/s3server.py" stop "$S3_DIR"
    stopped=1
  fi
  ((stopped)) && say "down" || say "nothing was running (stack dir $STACK_DIR)"
}

status() {
  local pid rc=0
  for comp in server worker; do
    if pid="$(live_pid "$comp")"; then say "$comp running (pid $pid)"; else say "$comp stopped"; rc=1; fi
  done
  if [[ -n "$EXTERNAL_DB" ]]; then say "database: PREFECT_SERVER_DATABASE_CONNECTION_URL (not started here)"
  elif pid="$(live_pid postgres postgres)"; then say "PostgreSQL running (pid $pid, port $(cat "$PG_PORT_FILE"))"
  else say "PostgreSQL stopped"; rc=1; fi
  if healthy; then say "API healthy at $API"; else say "API not answering at $API"; rc=1; fi
  local s3
  if s3="$("$PY" "$ROOT/infra/s3server.py" status "$S3_DIR")"; then say "S3 server $s3"
  else say "S3 server stopped"; rc=1; fi
  mlflow_status
  return $rc
}

case "$CMD" in
  up) up ;;
  setup) setup ;;
  automations) automations ;;
  down) down ;;
  status) status ;;
  restart)
    [[ "${2:-}" == s3 ]] || { echo "usage: $0 restart s3" >&2; exit 2; }
    s3_restart ;;
  *) echo "usage: $0 up|down|status|setup|automations|restart s3" >&2; exit 2 ;;
esac
