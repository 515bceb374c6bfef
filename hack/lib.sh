# Helpers shared by the scripts under hack/ (sourced, not run).
#   SCRIPT_NAME=foo; . "$(dirname "$0")/../lib.sh"

: "${SCRIPT_NAME:=hack}"
CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router"

log() { echo "$SCRIPT_NAME: $*" >&2; }
die() { echo "$SCRIPT_NAME: error: $*" >&2; exit 1; }

# need_debs PKG... : install the Debian packages that are missing (as root, with apt-get), or
# stop with a message that names them. Package names, not commands: dpkg knows what is there.
need_debs() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
      || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; } \
      || die "apt-get install ${missing[*]} failed (see above)"
    return 0
  fi
  die "missing packages: ${missing[*]}. Install them (apt-get install ${missing[*]}) as root."
}

# elapsed START : whole seconds since START (from `date +%s`).
elapsed() { echo $(( $(date +%s) - $1 )); }
