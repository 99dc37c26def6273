# Sourced by the launch scripts: pick the Python that has this package, setting up .venv when needed.
# Order: $ACLARENA_PYTHON; python3 when it already imports aclarena_slime (slime's image after
# `pip install -e . --no-deps`); otherwise .venv, created or refreshed by launch/setup.sh.
aclarena_python() {
  local root="$1"
  if [ -n "${ACLARENA_PYTHON:-}" ]; then
    echo "$ACLARENA_PYTHON"
  elif [ ! -x "$root/.venv/bin/python" ] && python3 -c 'import aclarena_slime, slime.rollout' >/dev/null 2>&1; then
    echo python3
  else
    bash "$root/launch/setup.sh" >&2
    echo "$root/.venv/bin/python"
  fi
}
